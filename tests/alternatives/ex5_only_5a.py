"""A student who did exactly 5a (issue 42): the allocator and block tables without any of 5d (allocate keeps a
cached block's hash, share only counts an owner, append never copies, blocks_needed counts no copy), and every TODO
after 5a left as the stub has it. `-k 5a` passes, every run: 5a's checks call nothing of 5d."""

from tests.part_runner import hybrid, parts_of

EXERCISE = "ex5_paged_kv_cache"
PART = "5a"
_copy = hybrid(EXERCISE, PART, parts_of(EXERCISE))


def allocate(self):
    if not self.free_blocks:
        raise _copy.NoFreeBlocks(f"All {self.num_blocks} KV blocks are in use: free a block (finish or preempt a sequence) first.")
    block, _ = self.free_blocks.popitem(last=False)
    self.ref_counts[block] = 1
    return block


def share(self, block):
    self.check_block(block)
    self.ref_counts[block] += 1


def blocks_needed(self, num_new_tokens, allocator):
    return -(-(self.num_tokens + num_new_tokens) // self.block_size) - len(self.blocks)


def append(self, num_new_tokens, allocator):
    self.num_tokens += num_new_tokens
    while len(self.blocks) * self.block_size < self.num_tokens:
        self.blocks.append(allocator.allocate())
    return []


_copy.BlockAllocator.allocate, _copy.BlockAllocator.share = allocate, share
_copy.BlockTable.blocks_needed, _copy.BlockTable.append = blocks_needed, append
globals().update({name: value for name, value in vars(_copy).items() if not name.startswith("_")})
