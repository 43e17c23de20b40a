"""A continuous batcher for which a request comes by the clock once its arrival_time has PASSED (arrival_time <
clock), not when it is reached: a request is not there at the very moment it arrives. With a real clock that
moment never comes exactly (time moves on); on an engine whose clock stands at the arrival time (a step right
after wait_for_next_arrival, or a clock that did not move), the request waits a step it should not."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that

module = reference_with_edit(EXERCISE, "Engine.schedule", "s.request.arrival_time <= now",
                             "s.request.arrival_time < now")  # the bug: < where the boundary counts

globals().update(public_names(module))
