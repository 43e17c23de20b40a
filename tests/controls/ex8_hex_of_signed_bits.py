"""stored_value formats the bits read as a SIGNED integer: a negative number's hex comes out with a minus
sign ("-472E") instead of its bit pattern with the sign bit set ("B8D2")."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def stored_value(x, dtype):
    dtype = _module._float_format(dtype)
    stored = torch.tensor(x, dtype=dtype)
    width = stored.element_size() * 8
    bits = stored.view({16: torch.int16, 32: torch.int32}[width]).item()  # the bug: no & 0xFFFF
    return stored.item(), f"{bits:0{width // 4}X}"


_module = reference_with(EXERCISE, stored_value=stored_value)
globals().update(public_names(_module))
