"""Flash-Decoding with a shortcut for a single key (its softmax weight is 1, so the output is its value): it
returns v itself, so the result shares storage with the argument (a caller that writes one changes the other)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex10_attention"
PART = "test_10c_differential_decoding"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "flash_decoding", "    partials = ", "    if k.shape[2] == 1:\n        return v\n    partials = ")))
