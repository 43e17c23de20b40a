"""Naive generate that grows the caller's prompt list in place (append each new token) and returns its tail: the
right tokens, but the caller's prompt is changed behind its back."""

import torch

from gpt import EOS_TOKEN_ID, check_request

EXERCISE = "ex1_generate"
PART = "test_differential"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    start = len(prompt_ids)
    for _ in range(max_new_tokens):
        ids = torch.tensor([prompt_ids], device=model.device)
        logits = model(ids, torch.arange(ids.shape[1], device=model.device)[None])
        prompt_ids.append(logits[0, -1].argmax().item())  # the bug: the argument is the working list
        if prompt_ids[-1] == eos_token_id:
            break
    return prompt_ids[start:]
