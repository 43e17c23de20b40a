"""block_hashes stops one token early: when the tokens fill their last block exactly, that block is full but
gets no hash, so the prefix cache never finds it."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_block_hashes_are_chained"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "block_hashes", "len(token_ids) - block_size + 1",
                                                  "len(token_ids) - block_size")))
