"""The symmetric scales are computed in the weight's own dtype and only then made float32: for a float16 or
bfloat16 weight, max|w| / 127 is rounded to 11 or 8 bits, so the scale is not the float32 max|w| / 127 the
contract states, and the largest weight can land past 127.5 steps (clamped: more than half a step off)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex8_quantization"
PART = "test_differential_8b_symmetric"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "_absmax", "scale = groups.abs().amax(dim=-1, keepdim=True).float() / QMAX",
    "scale = (groups.abs().amax(dim=-1, keepdim=True) / QMAX).float()  # the bug: divided in w's dtype")))
