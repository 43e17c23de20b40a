"""Int8Embedding dequantizes the whole [vocab, n_embd] matrix at every lookup and then picks the rows:
the right rows, at the cost of 50,257 rows of float32 made for a handful of tokens."""

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_embedding_dequantizes_only_the_rows_asked_for"  # the check that catches it: the control runner runs only that


class Int8Embedding(reference.Int8Embedding):
    def forward(self, input_ids):
        linear = self.int8_linear
        return reference.dequantize(linear.weight_int8, linear.scale)[input_ids]  # the bug: every row dequantized


globals().update(public_names(reference_with(EXERCISE, Int8Embedding=Int8Embedding)))
