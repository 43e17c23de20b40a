"""A continuous batcher that retires a finished request from the running batch but never gives its slot
back: after max_batch_size requests have finished, nobody waiting can be admitted any more."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"

globals().update(public_names(reference_with_edit(EXERCISE, "Engine.step", "self.free_slots.append(seq.slot)", "pass")))
