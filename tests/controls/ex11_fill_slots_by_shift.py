"""StaticInputs.fill that finds a position's slot with shifts and masks, (table[p >> s] << s) | (p & (block_size - 1))
with s = log2(block_size), as if the block size were a power of two: right for blocks of 1, 2, 4, 8, 16, wrong for 3."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_differential_fill"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "StaticInputs.fill", "slots = [table[p // bs] * bs + p % bs for",
    "s = bs.bit_length() - 1\n    slots = [(table[p >> s] << s) | (p & (bs - 1)) for")))
