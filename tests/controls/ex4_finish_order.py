"""A continuous batcher that returns the sequences in the order they finished, not the order the
requests were submitted."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def run(self, requests):
        result = super().run(requests)
        result.sequences = list(self.finished)  # the bug: finish order
        return result


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
