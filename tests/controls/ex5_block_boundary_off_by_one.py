"""A block table that takes a new block when the last one is exactly full (`<=` instead of `<`), not
when a token does not fit: k * block_size tokens hold k + 1 blocks (blocks_needed agrees with it)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
_copy = reference_with(EXERCISE)


class BlockTable(_copy.BlockTable):  # the copy's class: its fork() then makes tables of this subclass too
    def blocks_needed(self, num_new_tokens, allocator):
        new = (self.num_tokens + num_new_tokens) // self.block_size + 1 - len(self.blocks)  # the bug: floor + 1, not ceil
        return new + int(self._must_copy_last(num_new_tokens, allocator))

    def append(self, num_new_tokens, allocator):
        copies = []
        if self._must_copy_last(num_new_tokens, allocator):
            copy = allocator.allocate()
            copies.append((self.blocks[-1], copy))
            allocator.free(self.blocks[-1])
            self.blocks[-1] = copy
        self.num_tokens += num_new_tokens
        while len(self.blocks) * self.block_size <= self.num_tokens:  # the bug: <= takes a block for a full last one
            self.blocks.append(allocator.allocate())
        return copies


_copy.BlockTable = BlockTable
globals().update(public_names(_copy))
