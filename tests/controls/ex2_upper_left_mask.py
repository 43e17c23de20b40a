"""A causal mask aligned to the upper left (what SDPA's is_causal=True does): wrong when q_len != kv_len."""

import torch

from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, generate  # noqa: F401

EXERCISE = "ex2_kv_cache"


def causal_mask(q_len, kv_len, device):
    if q_len == 1:
        return None
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()  # the bug: diagonal 0


def forward(model, input_ids, position_ids, kv_cache, attention_mask=None):
    mask = causal_mask(input_ids.shape[1], len(kv_cache) + input_ids.shape[1], input_ids.device)
    if attention_mask is not None:
        padding = attention_mask[:, None, None, :]
        mask = padding if mask is None else mask & padding
    transformer = model.transformer
    x = transformer.wte(input_ids) + transformer.wpe(position_ids)
    for layer, block in enumerate(transformer.h):
        x = block_forward(block, x, kv_cache, layer, mask)
    return model.lm_head(transformer.ln_f(x))
