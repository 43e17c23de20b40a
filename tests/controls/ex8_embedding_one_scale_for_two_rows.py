"""Int8Embedding decides per tensor or per row by the scale's length, but with the wrong bound: a scale of two rows
(a two-row table quantized per channel) is read as one scale for both."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex8_quantization"
PART = "test_8c_embedding_dequantizes_only_the_rows_asked_for"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "Int8Embedding.forward", "scale.shape[0] > 1", "scale.shape[0] > 2")))
