"""A block allocator whose free list is a stack: the block freed last is handed out first. Every count is right and
no block is lost, but the contract's order (least recently freed first, so that a freed block that still caches a
prefix survives longest) is not kept: a student's report had it pass the default run most of the time (issue 42)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"


class BlockAllocator(reference.BlockAllocator):
    def free(self, block):
        super().free(block)
        if self.ref_counts[block] == 0:
            self.free_blocks.move_to_end(block, last=False)  # the bug: most recently freed first


globals().update(public_names(reference_with(EXERCISE, BlockAllocator=BlockAllocator)))
