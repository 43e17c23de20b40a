"""BlockAllocator.free refuses a double free with ValueError, as the stub asks, but only after taking the count
down: the refused call leaves the block's ref count at -1, so the pool's bookkeeping is wrong from then on (a
later share() makes it 0, "free" but not in the free list)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "5a_differential"  # the check that catches it

_BEFORE = """    if self.ref_counts[block] == 0:
        raise ValueError(f"block {block} is already free: each owner frees a block once.")
    self.ref_counts[block] -= 1
"""
_AFTER = """    self.ref_counts[block] -= 1  # the bug: the count goes down before the check
    if self.ref_counts[block] < 0:
        raise ValueError(f"block {block} is already free: each owner frees a block once.")
"""
globals().update(public_names(reference_with_edit(EXERCISE, "BlockAllocator.free", _BEFORE, _AFTER)))
