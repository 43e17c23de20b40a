"""KV-cache generate that checks for EOS one step late: it decodes once more after the EOS, then drops
that token. The right tokens, but a wasted forward pass after the end."""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, causal_mask, forward  # noqa: F401

EXERCISE = "ex2_kv_cache"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    while len(new_tokens) < max_new_tokens:
        logits = forward(model, input_ids, position_ids, kv_cache)
        if new_tokens and new_tokens[-1] == eos_token_id:  # the bug: tested after the next forward
            break
        new_tokens.append(int(logits[0, -1].argmax()))
        input_ids = torch.tensor([[new_tokens[-1]]], device=model.device)
        position_ids = position_ids[:, -1:] + 1
    return new_tokens
