"""Each graph is captured with a memory pool of its own: six graphs hold six sets of intermediates, where one
replays at a time."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

globals().update(public_names(reference_with_edit(EXERCISE, "DecodeGraphs.capture", "graphs.capture(graph, pool)",
                                                  "graphs.capture(graph)")))
