"""launch() has its ranks meet at one fixed port (29500, torch's usual MASTER_PORT) instead of a free one: it
works alone, and fails as soon as two runs share the machine or anything else listens there."""

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9d_launch_runs_every_rank"  # the check that catches it


def fixed_port():
    return 29500  # the bug: the same port for every launch


# _run_rank travels to the new processes by pickling: the reference's own, which they can import.
globals().update(public_names(reference_with(EXERCISE, free_port=fixed_port, _run_rank=reference._run_rank)))
