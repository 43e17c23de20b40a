"""Captures the smallest size first: the shared pool is sized for batch 1, and each larger graph grows it."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def capture(self):
        pool = None
        for size in sorted(self.sizes):  # the bug: ascending
            with base.graphs.warmup(self.model.device):
                base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)
            graph = base.graphs.new_graph(self.model.device)
            with base.graphs.capture(graph, pool):
                self.outputs[size] = base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)
            self.graphs[size], pool = graph, pool or graph.pool()


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
