"""Captures at once, without running the step first: on CUDA, what a first call sets up (cuBLAS workspaces, the
allocator's first blocks) lands inside the graph."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

globals().update(public_names(reference_with_edit(EXERCISE, "DecodeGraphs.capture", "for _ in range(2):", "for _ in range(0):")))
