"""quantize_asymmetric maps [min(x), max(x)] onto 0..255 without stretching the range to include 0:
fine for values on both sides of 0, but for all-positive (or all-negative) values 0 is not stored
exactly and the zero point falls outside 0..255, so clamping wrecks the values."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def quantize_asymmetric(x):
    lo, hi = x.min().float(), x.max().float()  # the bug: no clamp(max=0) / clamp(min=0)
    scale = (hi - lo) / 255
    if scale == 0:
        scale = torch.ones_like(scale)
    zero_point = int(torch.round(-lo / scale).clamp(0, 255))
    q = (torch.round(x.float() / scale) + zero_point).clamp(0, 255).to(torch.uint8)
    return q, scale, zero_point


globals().update(public_names(reference_with(EXERCISE, quantize_asymmetric=quantize_asymmetric)))
