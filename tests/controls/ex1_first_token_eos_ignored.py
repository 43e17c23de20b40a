"""Naive generate that stops at the model's EOS only once it has generated something before it: an EOS as the very
first new token is not a stop (the loop checks `len(new_tokens) > 1`)."""

import torch

from gpt import EOS_TOKEN_ID, check_request

EXERCISE = "ex1_generate"
PART = "test_differential"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    ids, new = list(prompt_ids), []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=model.device), torch.arange(len(ids), device=model.device)[None])
        new.append(logits[0, -1].argmax().item())
        if new[-1] == eos_token_id and len(new) > 1:  # the bug: the first token is never checked
            break
        ids.append(new[-1])
    return new
