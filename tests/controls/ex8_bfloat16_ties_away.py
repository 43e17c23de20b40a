"""round_to_bfloat16 rounds an exact tie away from zero (adds 0x8000 before dropping the low half)
instead of to the even neighbour: a bias that round-to-nearest-even exists to avoid."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def round_to_bfloat16(x, mode="nearest"):
    if mode == "truncate":
        return _module.round_to_bfloat16(x, mode)
    if x.dtype != _module.torch.float32:
        raise ValueError("round_to_bfloat16 takes a float32 tensor.")
    bits = x.view(_module.torch.int32) + 0x8000  # the bug: half up, whatever the last kept bit
    return (bits >> 16).to(_module.torch.int16).view(_module.torch.bfloat16)


_module = reference_with(EXERCISE)
_module.round_to_bfloat16 = round_to_bfloat16
globals().update(public_names(_module))
