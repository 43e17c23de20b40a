"""filter_logits converts only half-precision logits to float32 (`if logits.dtype in (float16, bfloat16)`):
float64 logits come back as float64, where the contract says any float dtype comes back as float32."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex6_decoding"
PART = "test_differential_6b_sampler"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "filter_logits", "logits = logits.float()",
    "logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits")))
