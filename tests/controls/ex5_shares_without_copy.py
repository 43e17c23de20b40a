"""No copy-on-write: a block table writes its next tokens into its last block in place even when that
block is partly filled and shared (after a fork), overwriting the sibling's tokens at the same offsets."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_copy_on_write"  # the check that catches it
_copy = reference_with(EXERCISE)


class BlockTable(_copy.BlockTable):  # the copy's class: its fork() then makes tables of this subclass too
    def _must_copy_last(self, num_new_tokens, allocator):
        return False  # the bug: a shared, partly filled last block is written in place


_copy.BlockTable = BlockTable
globals().update(public_names(_copy))
