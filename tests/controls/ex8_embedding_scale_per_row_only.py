"""Int8Embedding reads scale[input_ids] whatever the scale's shape: right per channel and per group, an
IndexError for an lm_head quantized per tensor (scale [1, 1] has one row, for every token)."""

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_embedding_reads_one_scale_for_all"  # the check that catches it: the control runner runs only that


class Int8Embedding(reference.Int8Embedding):
    def forward(self, input_ids):
        linear = self.int8_linear
        rows, row_scale = linear.weight_int8[input_ids], linear.scale[input_ids]  # the bug: scale [1, 1] has no row per id
        groups = rows.reshape(*rows.shape[:-1], row_scale.shape[-1], -1).float() * row_scale[..., None]
        return groups.reshape(rows.shape)


globals().update(public_names(reference_with(EXERCISE, Int8Embedding=Int8Embedding)))
