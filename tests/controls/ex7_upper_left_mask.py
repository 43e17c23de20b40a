"""Verification runs the k + 1 new tokens with an upper-left causal mask (what SDPA's is_causal=True
does when q_len != kv_len): query i sees keys 0..i of the whole cache instead of everything up to its
own position, so the target's scores after the first round are wrong."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7b"  # the checker's part that catches it


def upper_left_mask(q_len, kv_len, device):
    return None if q_len == 1 else torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()  # the bug: diagonal 0


globals().update(public_names(reference_with(EXERCISE, forward=reference_with("ex2_kv_cache", causal_mask=upper_left_mask).forward)))
