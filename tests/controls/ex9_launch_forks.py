"""launch() starts its ranks with the "fork" start method instead of "spawn": each rank is a copy of the parent
process, torch's threads and locks included, which may deadlock (it works here, most of the time)."""

import multiprocessing

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9d_launch_runs_every_rank"  # the check that catches it


class ForkingMultiprocessing:
    """torch.multiprocessing as launch uses it, but every context a fork."""

    @staticmethod
    def get_context(method=None):
        return multiprocessing.get_context("fork")  # the bug: "spawn" asked, "fork" given


globals().update(public_names(reference_with(EXERCISE, mp=ForkingMultiprocessing, _run_rank=reference._run_rank)))
