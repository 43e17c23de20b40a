"""A causal mask aligned to the upper left (what SDPA's is_causal=True does): wrong when q_len != kv_len."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"


def causal_mask(q_len, kv_len, device):
    if q_len == 1:
        return None
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()  # the bug: diagonal 0


globals().update(public_names(reference_with(EXERCISE, causal_mask=causal_mask)))
