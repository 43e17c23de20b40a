"""A continuous batcher that keeps the slots its running sequences hold in a CLASS attribute (`held = set()` in the
class body, to leave the given __init__ alone): every engine shares one set. One engine at a time, each run to its
end, works; two engines served side by side (two models, two servers in one process) take each other's slots, and
one of them admits fewer requests than its max_batch_size allows."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    held = set()  # the bug: on the class, one set for every engine

    def schedule(self):
        free, self.free_slots = self.free_slots, []
        super().schedule()  # the arrivals join the waiting queue; nobody admitted here
        self.free_slots = free
        admitted = []
        while self.waiting and len(self.held) < self.max_batch_size:
            seq = self.waiting.popleft()
            seq.slot = min(set(range(self.max_batch_size)) - self.held)
            self.held.add(seq.slot)
            seq.admitted_step = self.step_index
            admitted.append(seq)
        return admitted

    def step(self):
        before = len(self.finished)
        super().step()
        for seq in self.finished[before:]:
            self.held.discard(seq.slot)


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
