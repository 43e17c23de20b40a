"""A running batch that lines rows up when a request joins, but marks the columns it pads with as
real (True in the mask): rows then attend to zero keys that belong to nobody."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_running_batch_add_and_remove"  # the check that catches it: the control runner runs only that


class RunningBatch(reference.RunningBatch):
    def add(self, seqs, kv_cache, mask):
        old_rows, old_width, new_width = len(self.seqs), self.mask.shape[1], mask.shape[1]
        super().add(seqs, kv_cache, mask)
        if old_rows:
            width = self.mask.shape[1]
            self.mask[:old_rows, :width - old_width] = True  # the bug: the padding added on joining is not masked
            self.mask[old_rows:, :width - new_width] = True


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch)))
