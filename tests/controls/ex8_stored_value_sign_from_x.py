"""stored_value avoids the signed-bits trap by reading the bits of |x| and setting the sign bit when x < 0:
-0.0 is not < 0, so its sign bit is lost ("0000" where float16 stores "8000"), and a negative NaN alike."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_differential_8a"  # the check that catches it


def stored_value(x, dtype):
    dtype = _module._float_format(dtype)
    stored = torch.tensor(x, dtype=dtype)
    width = stored.element_size() * 8
    bits = stored.abs().view({16: torch.int16, 32: torch.int32}[width]).item()
    if x < 0:  # the bug: -0.0 < 0 is False
        bits |= 1 << (width - 1)
    return stored.item(), f"{bits:0{width // 4}X}"


_module = reference_with(EXERCISE, stored_value=stored_value)
globals().update(public_names(_module))
