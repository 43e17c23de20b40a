"""KV-cache generate whose decode steps run at positions T+1, T+2, ... instead of T, T+1, ..."""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, causal_mask, forward  # noqa: F401

EXERCISE = "ex2_kv_cache"
PART = "test_matches_naive"  # the check that catches it


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = forward(model, input_ids, position_ids, kv_cache)
        new_tokens.append(int(logits[0, -1].argmax()))
        if new_tokens[-1] == eos_token_id:
            break
        input_ids = torch.tensor([[new_tokens[-1]]], device=model.device)
        position_ids = position_ids[:, -1:] + 2  # the bug: skips a position
    return new_tokens
