"""BlockTable.blocks_needed counts the new blocks only, not the copy that append makes of a shared, partly
filled last block (copy-on-write): after a fork the scheduler trusts it, schedules a write with one block
too few free, and append runs into NoFreeBlocks under pressure."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_scheduler_counts_every_seat_and_block"  # the check that catches it (test_5d_blocks_needed_counts too)
_copy = reference_with(EXERCISE)


class BlockTable(_copy.BlockTable):  # the copy's class: its fork() then makes tables of this subclass too
    def blocks_needed(self, num_new_tokens, allocator):
        return -(-(self.num_tokens + num_new_tokens) // self.block_size) - len(self.blocks)  # the bug: no + 1 for the copy


_copy.BlockTable = BlockTable
globals().update(public_names(_copy))
