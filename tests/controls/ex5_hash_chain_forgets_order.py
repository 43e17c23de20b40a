"""block_hashes chains each block with its parent by adding the blocks' own hashes: every block's hash
depends on all the blocks before it, but not on their order, so the same blocks swapped count as a hit."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_block_hashes_depend_on_the_order_of_the_blocks"  # the check that catches it


def block_hashes(token_ids, block_size):
    hashes, parent = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = (parent + hash(tuple(token_ids[start:start + block_size]))) % (1 << 61)  # the bug: a sum forgets the order
        hashes.append(parent)
    return hashes


globals().update(public_names(reference_with(EXERCISE, block_hashes=block_hashes)))
