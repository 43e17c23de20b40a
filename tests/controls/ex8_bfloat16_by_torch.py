"""round_to_bfloat16 rounds to nearest with torch's own x.to(torch.bfloat16) instead of on the bits: the
right bits, but the exercise (rounding by hand, ties to even) is skipped."""

import torch

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8a_bfloat16_by_hand_not_by_torch"  # the check that catches it: the control runner runs only that


def round_to_bfloat16(x, mode="nearest"):
    if mode == "nearest" and x.dtype == torch.float32:
        return x.to(torch.bfloat16)  # the bug: torch converts; nothing is done on the bits
    return reference.round_to_bfloat16(x, mode)


globals().update(public_names(reference_with(EXERCISE, round_to_bfloat16=round_to_bfloat16)))
