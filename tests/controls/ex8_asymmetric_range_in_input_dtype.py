"""quantize_asymmetric takes the range and the scale in the input's dtype and makes the scale float32 at the
end: right for float32 and float64 values, but a float16 or bfloat16 input gets a scale rounded to 11 or 8
bits (not torch.ao's float32 scale), and with it other integers."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex8_quantization"
PART = "test_differential_8b_asymmetric"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "quantize_asymmetric",
    "lo, hi = x.min().float().clamp(max=0), x.max().float().clamp(min=0)\n    scale = (hi - lo) / 255",
    "lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)\n    scale = ((hi - lo) / 255).float()  # the bug: in x's dtype")))
