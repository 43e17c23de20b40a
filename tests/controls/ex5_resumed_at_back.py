"""preempt() puts the victim at the BACK of the waiting queue: requests that never ran are admitted
before it resumes (its tokens are still right, but first come first served is broken)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_preemption_by_recompute"  # the check that catches it


class Engine(reference.Engine):
    def preempt(self, seq):
        super().preempt(seq)
        self.waiting.remove(seq)
        self.waiting.append(seq)  # the bug: the back of the queue, not the front


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
