"""BlockTable.blocks_needed counts the copy of a shared, partly filled last block whatever the number of new tokens,
0 included: blocks_needed(0) on a forked table says 1, while append(0) writes nothing and takes nothing. The
engine never asks for 0 tokens, so only a caller that does sees it."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "5d_differential_blocks"  # the check that catches it (a forked table: 5d)

globals().update(public_names(reference_with_edit(
    EXERCISE, "BlockTable.blocks_needed",
    "return new + int(self._must_copy_last(num_new_tokens, allocator))",
    "return new + int(self.num_tokens % self.block_size != 0 and allocator.ref_counts[self.blocks[-1]] > 1)  # the bug: 0 new tokens too")))
