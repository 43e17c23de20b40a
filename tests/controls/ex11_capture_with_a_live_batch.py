"""capture() first fills the buffers with a made-up batch of real-looking rows (token 0 at position 0 in block 0),
so that its warm-up and capture write a key and value into block 0, which a sequence may own."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def capture(self):
        size = max(self.sizes)
        self.inputs.fill([0] * size, [0] * size, [[0]] * size, size)  # the bug: rows that write into block 0
        super().capture()


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
