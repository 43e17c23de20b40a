"""causal_mask ignores its `device` and makes the mask on the default device: right on a CPU, but on a GPU
the mask meets the queries there and SDPA raises."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
PART = "test_causal_mask_is_made_on_the_given_device"  # the check that catches it: the control runner runs only that


def causal_mask(q_len, kv_len, device):
    if q_len == 1:
        return None
    return torch.ones(q_len, kv_len, dtype=torch.bool).tril(diagonal=kv_len - q_len)  # the bug: no device=device


globals().update(public_names(reference_with(EXERCISE, causal_mask=causal_mask)))
