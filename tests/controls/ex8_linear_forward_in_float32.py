"""Int8Linear.forward dequantizes its weight to float32 whatever the input's dtype: right for float32
inputs, an error (or a silent float32 result) for float64, float16 or bfloat16 activations."""

import torch.nn.functional as F

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_int8_linear_follows_the_inputs_dtype"  # the check that catches it: the control runner runs only that


class Int8Linear(reference.Int8Linear):
    def forward(self, x):
        weight = reference.dequantize(self.weight_int8, self.scale)  # the bug: float32, not x's dtype
        return F.linear(x, weight, self.bias)


globals().update(public_names(reference_with(EXERCISE, Int8Linear=Int8Linear)))
