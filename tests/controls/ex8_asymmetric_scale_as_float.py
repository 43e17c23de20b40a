"""quantize_asymmetric returns its scale as a Python float (scale.item()) instead of a float32 0-d
tensor: the numbers are right, the type the contract promises is not."""

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8b_asymmetric_scale_is_a_float32_scalar_tensor"  # the check that catches it: the control runner runs only that


def quantize_asymmetric(x):
    q, scale, zero_point = reference.quantize_asymmetric(x)
    return q, scale.item(), zero_point  # the bug: a Python float


globals().update(public_names(reference_with(EXERCISE, quantize_asymmetric=quantize_asymmetric)))
