"""A block allocator whose free() counts the owner off but never puts a block with no owner left
back on the free list: every finished or preempted sequence leaks its blocks until the pool runs dry."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"


class BlockAllocator(reference.BlockAllocator):
    def free(self, block):
        if self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is already free: each owner frees a block once.")
        self.ref_counts[block] -= 1  # the bug: at 0 the block is not returned to self.free_blocks


globals().update(public_names(reference_with(EXERCISE, BlockAllocator=BlockAllocator)))
