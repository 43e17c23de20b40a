"""BlockTable.slot_mapping joins block and offset with a bitwise or: block * block_size | offset equals
block * block_size + offset only when the block size is a power of two (a block of 6: block 1, offset 2 gives
slot 6, not 8, and overwrites another position's key)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5a_slot_mapping_goes_through_the_block_table"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "BlockTable.slot_mapping", "* self.block_size + p % self.block_size",
                                                  "* self.block_size | p % self.block_size")))
