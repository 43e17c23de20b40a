"""A running batch that cuts out finished rows but never drops the columns that became padding in
every row: right tokens, but the cache only ever grows (every step then attends over dead width)."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "memory_stays_bounded"


class RunningBatch(reference.RunningBatch):
    def remove(self, done):
        keep = [row for row, seq in enumerate(self.seqs) if seq not in done]
        self.seqs = [self.seqs[row] for row in keep]
        self.mask = self.mask[keep]  # the bug: no trimming of the leading columns
        for layer in range(len(self.kv_cache.keys)):
            self.kv_cache.keys[layer] = self.kv_cache.keys[layer][keep]
            self.kv_cache.values[layer] = self.kv_cache.values[layer][keep]


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch)))
