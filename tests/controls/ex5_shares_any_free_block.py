"""share() takes any free block off the free list and owns it, whether or not it caches tokens: sharing a
block nobody's tokens are in (a bug in the caller) goes through silently instead of a ValueError."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_sharing_a_free_block_that_caches_nothing_is_refused"  # the check that catches it


class BlockAllocator(reference.BlockAllocator):
    def share(self, block):
        if self.ref_counts[block] == 0:
            self.free_blocks.pop(block, None)  # the bug: no check that the free block caches tokens
        self.ref_counts[block] += 1


globals().update(public_names(reference_with(EXERCISE, BlockAllocator=BlockAllocator)))
