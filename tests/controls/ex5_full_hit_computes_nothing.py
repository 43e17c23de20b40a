"""prefix_hits hashes ALL of the sequence's tokens, not all but the last: a prompt found whole in the
cache is scheduled with 0 tokens to compute, and its first token is sampled from whatever logits
forward() returns in its row (those of the sequence packed before it)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5d_prefix_cache_hits"  # the check that catches it


class Engine(reference.Engine):
    def prefix_hits(self, seq):
        if not self.enable_prefix_caching:
            return []
        hits = []
        for block_hash in reference.block_hashes(seq.token_ids, self.block_size):  # the bug: not token_ids[:-1]
            block = self.allocator.cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
