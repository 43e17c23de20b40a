"""A continuous batcher with an off-by-one in its slots: up to max_batch_size + 1 requests run."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_outputs_equal_each_request_alone"  # the check that catches it: the control runner runs only that


class Engine(reference.Engine):
    def __init__(self, model, max_batch_size, eos_token_id=reference.EOS_TOKEN_ID):
        super().__init__(model, max_batch_size, eos_token_id)
        self.free_slots = list(range(max_batch_size + 1))  # the bug: one slot too many


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
