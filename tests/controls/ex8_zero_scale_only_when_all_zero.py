"""The symmetric quantizers guard against a zero absmax only when the WHOLE tensor is zero: an all-zero row
(per channel) or group (per group) among others keeps the scale 0 (the stub: "give it a scale that is not 0,
never NaN"); its weights come out of 0 / 0, and a caller that divides by the scale gets NaN."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex8_quantization"
PART = "test_differential_8b_symmetric"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "_absmax", "scale = torch.where(scale == 0, torch.ones_like(scale), scale)",
    "scale = torch.ones_like(scale) if not scale.any() else scale  # the bug: only an all-zero tensor")))
