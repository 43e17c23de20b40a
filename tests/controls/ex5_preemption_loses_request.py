"""preempt() frees the victim's blocks but never puts it back in the waiting queue: a preempted
request is silently dropped and never finishes."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"


class Engine(reference.Engine):
    def preempt(self, seq):
        seq.block_table.free(self.allocator)
        seq.block_table, seq.num_computed = None, 0
        seq.preemptions += 1
        self.stats.preemptions += 1  # the bug: no self.waiting.appendleft(seq)


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
