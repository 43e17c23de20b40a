"""Captures the smallest size (at the narrowest width) first: the shared pool is sized for batch 1 over one block, and
each larger graph grows it."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

globals().update(public_names(reference_with_edit(EXERCISE, "DecodeGraphs.capture", "sorted(pairs, reverse=True)",
                                                  "sorted(pairs)")))
