"""Int8Linear keeps linear.bias.detach() as its bias buffer: detached, but the SAME storage as the given
Linear's bias (the stub asks for "a float copy of linear.bias"): a caller that changes the fp32 layer's bias
(fine-tuning it, loading other weights) silently changes the int8 layer too."""

import solutions.ex8_quantization as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_differential_8c_linear_and_embedding"  # the check that catches it


class Int8Linear(reference.Int8Linear):
    def __init__(self, linear, granularity="channel"):
        super().__init__(linear, granularity)
        if linear.bias is not None:
            self.bias = linear.bias.detach()  # the bug: detached, not copied (a buffer, sharing the Linear's storage)


globals().update(public_names(reference_with(EXERCISE, Int8Linear=Int8Linear)))
