"""launch waits for (joins) every rank's process before it reads their results from the queue: fine while
results are small, but a result larger than the pipe's buffer (64 KiB) blocks its process in put() until
someone reads it, so the rank never ends and launch waits forever: a deadlock."""

import torch.multiprocessing as mp

import solutions.ex9_tensor_parallel as reference

from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9d_launch_returns_large_results"  # the check that catches it


def launch(fn, world_size, *args, backend="gloo"):
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: launch needs at least one process.")
    context = mp.get_context("spawn")
    replies, port = context.SimpleQueue(), reference.free_port()
    ranks = [context.Process(target=reference._run_rank, args=(rank, world_size, port, backend, fn, args, replies), daemon=True)
             for rank in range(world_size)]  # (the reference's _run_rank: the new processes import it by name)
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()  # the bug: waits for the ranks first; a rank whose result fills the pipe never ends
    results = {}
    while not replies.empty():
        rank, ok, value = replies.get()
        if not ok:
            raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
        results[rank] = value
    return [results[rank] for rank in range(world_size)]


_module = reference_with(EXERCISE, launch=launch)
globals().update(public_names(_module))
