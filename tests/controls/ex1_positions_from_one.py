"""Naive generate whose position ids start at 1 instead of 0."""

import torch

from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    ids, new_tokens = list(prompt_ids), []
    for _ in range(max_new_tokens):
        x = torch.tensor([ids], device=model.device)
        logits = model(x, torch.arange(1, len(ids) + 1, device=model.device)[None])
        new_tokens.append(int(logits[0, -1].argmax()))
        if new_tokens[-1] == eos_token_id:
            break
        ids.append(new_tokens[-1])
    return new_tokens
