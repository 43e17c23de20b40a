"""A running batch that cuts finished rows out of the batch but parks their keys and values in a list
(to bring a request back later, say) and never frees them: every token is right, but the batch's memory
grows with every request that joins and leaves."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "memory_stays_bounded"


class RunningBatch(reference.RunningBatch):
    def __init__(self, n_layer, device):
        super().__init__(n_layer, device)
        self.parked = []  # the bug: never emptied

    def remove(self, done):
        for row, seq in enumerate(self.seqs):
            if seq in done:
                self.parked.append(([k[row].clone() for k in self.kv_cache.keys], [v[row].clone() for v in self.kv_cache.values]))
        super().remove(done)


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch)))
