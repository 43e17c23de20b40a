"""Captures at once, without running the step first: on CUDA, what a first call sets up (cuBLAS workspaces, the
allocator's first blocks) lands inside the graph."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def capture(self):
        pool = None
        for size in sorted(self.sizes, reverse=True):
            graph = base.graphs.new_graph(self.model.device)
            with base.graphs.capture(graph, pool):  # the bug: no warm-up
                self.outputs[size] = base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)
            self.graphs[size], pool = graph, pool or graph.pool()


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
