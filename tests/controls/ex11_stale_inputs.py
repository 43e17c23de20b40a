"""run() copies each step's values into a new StaticInputs instead of the one the graphs were captured with: the
replay reads the capture's buffers, and returns logits of a batch of padding."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def run(self, token_ids, positions, block_tables):
        old = self.inputs
        self.inputs = base.StaticInputs(max(self.sizes), self.max_blocks, old.block_size, old.scratch_block, old.input_ids.device)
        return super().run(token_ids, positions, block_tables)  # the bug: fills the new buffers, replays the old


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
