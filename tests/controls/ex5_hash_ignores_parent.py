"""block_hashes hashes each full block's tokens alone, not chained with its parent's hash: the same
tokens after a different prefix (whose keys and values differ) count as a prefix-cache hit."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_block_hashes"  # the check that catches it


def block_hashes(token_ids, block_size):
    return [hash(tuple(token_ids[start:start + block_size]))  # the bug: no parent in the hash
            for start in range(0, len(token_ids) - block_size + 1, block_size)]


globals().update(public_names(reference_with(EXERCISE, block_hashes=block_hashes)))
