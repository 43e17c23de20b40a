"""Symmetric quantization over the whole int8 range -128..127 used as if it were symmetric: scale =
max|w| / 128, so a largest weight that is negative becomes -128 (which has no +128 twin) and a largest
weight that is positive is clipped from 128 to 127, a whole step off."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def _absmax(groups, shape):
    scale = groups.abs().amax(dim=-1, keepdim=True).float() / 128  # the bug: 256 levels, "half" each side
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale).clamp(-128, 127).to(torch.int8)
    return q.reshape(shape), scale.squeeze(-1)


globals().update(public_names(reference_with(EXERCISE, _absmax=_absmax)))
