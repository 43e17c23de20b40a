"""Naive generate that stops as soon as the sequence holds an EOS, so an <|endoftext|> in the prompt ends it."""

import torch

from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    ids, new_tokens = list(prompt_ids), []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=model.device), torch.arange(len(ids), device=model.device)[None])
        new_tokens.append(int(logits[0, -1].argmax()))
        ids.append(new_tokens[-1])
        if eos_token_id in ids:  # the bug: looks at the prompt too
            break
    return new_tokens
