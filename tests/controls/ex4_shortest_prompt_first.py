"""A continuous batcher that admits the waiting request with the shortest prompt first (cheaper
prefills, better mean TTFT) instead of first come, first served: a long prompt can starve."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def schedule(self):
        free, self.free_slots = self.free_slots, []
        super().schedule()  # the arrivals join the waiting queue; nobody admitted yet
        self.free_slots = free
        self.waiting = reference.deque(sorted(self.waiting, key=lambda s: len(s.request.prompt_ids)))  # the bug
        return super().schedule()


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
