"""Int8Linear keeps its bias as an nn.Parameter instead of a buffer: the optimizer would train it, and
the layer is no longer the frozen, stored-only module the contract describes."""

import torch.nn as nn

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_int8_linear_keeps_buffers"  # the check that catches it: the control runner runs only that


class Int8Linear(reference.Int8Linear):
    def __init__(self, linear, granularity="channel"):
        super().__init__(linear, granularity)
        if self.bias is not None:
            bias = self.bias
            del self._buffers["bias"]
            self.bias = nn.Parameter(bias)  # the bug: a trainable parameter


globals().update(public_names(reference_with(EXERCISE, Int8Linear=Int8Linear)))
