"""Each graph is captured with a memory pool of its own: six graphs hold six sets of intermediates, where one
replays at a time."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def capture(self):
        for size in sorted(self.sizes, reverse=True):
            with base.graphs.warmup(self.model.device):
                base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)
            graph = base.graphs.new_graph(self.model.device)
            with base.graphs.capture(graph):  # the bug: no shared pool
                self.outputs[size] = base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)
            self.graphs[size] = graph


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
