"""launch() always joins its ranks with gloo, whatever backend it is given: right on a CPU by default, wrong
as soon as a caller asks for another backend (NCCL on GPUs)."""

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9d_launch_runs_every_rank"  # the check that catches it


def run_rank_with_gloo(rank, world_size, port, backend, fn, args, replies):
    reference._run_rank(rank, world_size, port, "gloo", fn, args, replies)  # the bug: the backend asked for is dropped


# The rank's function travels to the new processes by pickling: defined here, in a module they can import.
globals().update(public_names(reference_with(EXERCISE, _run_rank=run_rank_with_gloo)))
