"""A continuous batcher that sets arrival_s to the request's arrival_time only: right for arrivals by
the clock, but a request scripted to arrive at a later step keeps arrival_s = 0.0 (so its TTFT counts
time before it existed)."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_staggered_joins_and_leaves"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def schedule(self):
        admitted = super().schedule()
        for seq in self.sequences:
            seq.arrival_s = seq.request.arrival_time  # the bug: the step of a scripted arrival is ignored
        return admitted


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
