"""A 'continuous' batcher that admits new requests only once the running batch is empty: static
batching in disguise. Right tokens, but slots sit idle while requests wait."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def schedule(self):
        if self.running.seqs:  # the bug: nobody joins a batch that is still running
            self.free_slots, free = [], self.free_slots
            admitted = super().schedule()  # still moves the arrivals into the waiting queue
            self.free_slots = free
            return admitted
        return super().schedule()


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
