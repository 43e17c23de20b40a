"""KV-cache generate with a correct cache whose decode positions restart at 0 every 64 tokens (a position
counter kept modulo a window): right for short sequences, wrong on long ones."""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, causal_mask, forward  # noqa: F401

EXERCISE = "ex2_kv_cache"
PART = "test_long_sequence"  # the check that catches it


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
        position_ids = (position_ids[:, -1:] + 1) % 64  # the bug: positions wrap around
    return new_tokens
