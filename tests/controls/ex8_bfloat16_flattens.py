"""round_to_bfloat16 flattens x to work on its bits and returns the flat result: right for a 1-D tensor, but a
0-d or 2-D float32 tensor comes back 1-D (the stub: "a bfloat16 tensor of x's shape")."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex8_quantization"
PART = "test_differential_8a"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "round_to_bfloat16", "bits = x.view(torch.int32)", "bits = x.reshape(-1).view(torch.int32)  # the bug: never reshaped back")))
