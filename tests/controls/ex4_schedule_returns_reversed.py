"""A scheduler that admits first come, first served but returns the admitted sequences newest first
(admitted.insert(0, seq)): the right requests run, yet schedule() misreports the order it admitted them."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_admitted_and_finished_in_order"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def schedule(self):
        now = self.clock()
        for seq in [s for s in self.pending if s.request.arrival_step <= self.step_index and s.request.arrival_time <= now]:
            self.pending.remove(seq)
            seq.arrival_s = seq.request.arrival_time if seq.request.arrival_step == 0 else max(seq.request.arrival_time, now)
            self.waiting.append(seq)
        admitted = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot, seq.admitted_step = self.free_slots.pop(0), self.step_index
            admitted.insert(0, seq)  # the bug: the last admitted comes first
        return admitted


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
