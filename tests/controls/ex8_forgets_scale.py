"""Int8Linear.forward multiplies by the int8 integers as they are: the scale is forgotten, so every
weight comes out about 127 / max|w| times too large."""

import torch.nn.functional as F

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
_module = reference_with(EXERCISE)


class Int8Linear(_module.Int8Linear):
    def forward(self, x):
        return F.linear(x, self.weight_int8.to(x.dtype), self.bias)  # the bug: q, not q * scale


_module.Int8Linear = Int8Linear  # quantize_model builds these
globals().update(public_names(_module))
