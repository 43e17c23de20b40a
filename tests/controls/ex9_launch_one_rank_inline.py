"""launch(fn, 1, ...) runs fn in this process, without a new process or a process group ("one rank needs no
launching"): fn's collectives then find no group (a ParallelGPT's forward fails), and fn runs with this
process's threads and state instead of a fresh rank's."""

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with


EXERCISE = "ex9_tensor_parallel"
PART = "test_differential_9d"  # the check that catches it


def launch(fn, world_size, *args, backend="gloo"):
    if world_size == 1:  # the bug: no process, no group
        return [fn(0, 1, *args)]
    return reference.launch(fn, world_size, *args, backend=backend)


globals().update(public_names(reference_with(EXERCISE, launch=launch)))
