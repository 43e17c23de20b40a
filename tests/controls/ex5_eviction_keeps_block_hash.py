"""allocate() evicts a cached free block by forgetting its hash in block_of_hash only: hash_of_block still
lists the block with its old hash, so once handed out again it can never cache its new tokens."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_an_evicted_block_forgets_its_hash_both_ways"  # the check that catches it


class BlockAllocator(reference.BlockAllocator):
    def allocate(self):
        if not self.free_blocks:
            raise reference.NoFreeBlocks(f"All {self.num_blocks} KV blocks are in use: free a block (finish or preempt a "
                                         f"sequence) before allocating another.")
        block, _ = self.free_blocks.popitem(last=False)
        self.block_of_hash.pop(self.hash_of_block.get(block), None)  # the bug: hash_of_block keeps the block's old hash
        self.ref_counts[block] = 1
        return block


globals().update(public_names(reference_with(EXERCISE, BlockAllocator=BlockAllocator)))
