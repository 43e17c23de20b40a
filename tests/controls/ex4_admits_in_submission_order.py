"""A continuous batcher that moves the requests that arrived during one step into the waiting queue in the order
they were SUBMITTED, not the order they arrived (the reference's own bug of issue 34): two requests that arrive
by the clock within one step, the later-submitted first (0.12 s, submitted second, and 0.14 s, submitted first),
are admitted 0.14 s first. First come, first served is by arrival, even within one step."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that

module = reference_with_edit(EXERCISE, "Engine.schedule",
                             "self.waiting.extend(sorted(arrived, key=lambda seq: (seq.arrival_s, seq.id)))",
                             "self.waiting.extend(arrived)  # the bug: submission order")

globals().update(public_names(module))
