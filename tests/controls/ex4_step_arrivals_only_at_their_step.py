"""A continuous batcher that lets a request scripted by arrival_step arrive only AT that step (arrival_step ==
step_index; "it joins the waiting queue at the start of that engine step"), and one that comes by the clock once
its time has come. run() visits every step, so every request arrives; a request submitted with add_request after
its step has passed (a late submission, as a server makes them) never arrives, and its engine never ends."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that

module = reference_with_edit(
    EXERCISE, "Engine.schedule",
    "s.request.arrival_step <= self.step_index and s.request.arrival_time <= now",
    "(s.request.arrival_step == self.step_index if s.request.arrival_step else s.request.arrival_time <= now)")  # the bug

globals().update(public_names(module))
