"""Int8Linear.forward dequantizes once and keeps the float32 weight on the layer for the next calls:
right outputs, and its bytes look int8 until the first forward, after which it holds a float copy again."""

import torch.nn.functional as F

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_int8_linear_dequantizes_on_every_call"  # the check that catches it: the control runner runs only that


class Int8Linear(reference.Int8Linear):
    def forward(self, x):
        if getattr(self, "_dequantized", None) is None:
            self._dequantized = reference.dequantize(self.weight_int8, self.scale)  # the bug: kept between calls
        return F.linear(x, self._dequantized.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


globals().update(public_names(reference_with(EXERCISE, Int8Linear=Int8Linear)))
