"""launch() never checks world_size: launch(fn, 0) starts no process and returns an empty list, instead of a
ValueError saying that a run needs at least one rank."""

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9d_launch_refuses_world_size_below_one"  # the check that catches it


def launch(fn, world_size, *args, backend="gloo"):
    if world_size < 1:
        return []  # the bug: no ValueError
    return reference.launch(fn, world_size, *args, backend=backend)


globals().update(public_names(reference_with(EXERCISE, launch=launch)))
