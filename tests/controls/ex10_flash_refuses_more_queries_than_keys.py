"""FlashAttention that refuses more queries than keys even without the causal mask: the check belongs to the
lower-right mask only (HBM makes it there); unmasked attention of Tq > Tk queries is well defined."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex10_attention"
PART = "test_10b_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "flash_attention", "offset = Tk - Tq",
    "offset = Tk - Tq\n    if offset < 0:\n        raise ValueError(f'{Tq} queries but {Tk} keys')")))
