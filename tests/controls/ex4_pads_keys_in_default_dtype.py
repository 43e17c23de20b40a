"""A running batch that left-pads the keys and values with torch.zeros(shape) (the default dtype, float32) where the
mask gets its own bool zeros: right for a float32 model, but for a float16 or bfloat16 one torch.cat promotes the
joined cache to float32, and the next decode meets half-precision queries with float32 keys."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_generate or test_differential_engine"  # the checks that catch it (the engine check at every seed, by a named edge)


def _pad_left(t, width):
    time_dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[time_dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[time_dim] = missing
    if t.dtype == torch.bool:
        return torch.cat([torch.zeros(shape, dtype=torch.bool, device=t.device), t], dim=time_dim)
    return torch.cat([torch.zeros(shape, device=t.device), t], dim=time_dim)  # the bug: no dtype=t.dtype


globals().update(public_names(reference_with(EXERCISE, _pad_left=_pad_left)))
