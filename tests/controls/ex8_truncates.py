"""The symmetric quantizers cast w / scale to int8 directly, which truncates towards zero instead of
rounding to the nearest integer: up to a whole step off instead of half, and biased towards zero."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def _absmax(groups, shape):
    scale = groups.abs().amax(dim=-1, keepdim=True).float() / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (groups / scale).clamp(-127, 127).to(torch.int8)  # the bug: .to(int8) truncates; no round()
    return q.reshape(shape), scale.squeeze(-1)


globals().update(public_names(reference_with(EXERCISE, _absmax=_absmax)))
