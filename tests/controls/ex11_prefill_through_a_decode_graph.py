"""Every step goes through the decode graphs, a chunk of a prompt as its last token only: its earlier tokens never
reach the cache."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_same_tokens_as_exercise_5_with_decode_steps_on_graphs"

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def run_model(self, scheduled):
        if self.graphs is None:
            return super().run_model(scheduled)
        return self.graphs.run([seq.token_ids[seq.num_computed + n - 1] for seq, n in scheduled],
                               [seq.num_computed + n - 1 for seq, n in scheduled], [seq.block_table.blocks for seq, _ in scheduled])


base.Engine = Engine
globals().update(public_names(base))
