"""Graphs for the powers of two below max_batch_size only: a full batch of 6 falls outside every captured size."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"


def capture_sizes(max_batch_size):
    return [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size] or [1]


globals().update(public_names(reference_with(EXERCISE, capture_sizes=capture_sizes)))
