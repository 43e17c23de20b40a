"""A continuous batcher without a waiting queue: a request that arrives while every slot is taken
is silently dropped (it never runs and never finishes)."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def schedule(self):
        admitted = super().schedule()
        self.waiting.clear()  # the bug: whoever did not get a slot now is forgotten
        return admitted


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
