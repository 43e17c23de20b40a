"""quantize_per_channel takes the absmax over dim 0: one scale per INPUT column ([1, in]) instead of one
per output channel (row): a row of small weights shares its scales with the other rows' large ones, and
an outlier spreads down its column into every row."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def quantize_per_channel(w):
    _module._check_weight(w)
    scale = w.abs().amax(dim=0, keepdim=True).float() / 127  # the bug: over the rows, per input column
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale  # dequantize() reads [1, in] as per-column groups


_module = reference_with(EXERCISE, quantize_per_channel=quantize_per_channel)
globals().update(public_names(_module))
