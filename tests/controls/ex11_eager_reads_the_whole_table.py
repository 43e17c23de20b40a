"""Without graphs, run() still attends over max_blocks blocks: right, but a CPU pays for every padded key (the
graph's fixed width is only needed where a graph replays)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_runs_eagerly_without_graphs"

base = reference_with(EXERCISE)


class DecodeGraphs(base.DecodeGraphs):
    def run(self, token_ids, positions, block_tables):
        if self.graphs:
            return super().run(token_ids, positions, block_tables)
        size = base.padded_size(len(token_ids), self.sizes)
        self.inputs.fill(token_ids, positions, block_tables, size)
        return base.decode_step(self.model, self.cache, self.inputs, size, self.max_blocks)[:len(token_ids)]


base.DecodeGraphs = DecodeGraphs
globals().update(public_names(base))
