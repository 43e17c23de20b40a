"""Paged Flash-Decoding that counts the sequence's blocks with a shift, (length + block_size - 1) >> log2(block_size),
as if the block size were a power of two: for blocks of 3 it takes too many table entries, and reads the spare
ones (their slots are then cut off: the numbers stay right). Right for blocks of 1, 2, 4, 8, 16."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex10_attention"
PART = "test_10c_differential_paged"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "paged_flash_decoding", "[:-(-length // block_size)]",
    "[:(length + block_size - 1) >> (block_size.bit_length() - 1)]")))
