"""The engine builds the graphs and never replays them: every step runs eagerly."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_same_tokens_as_exercise_5_with_decode_steps_on_graphs"

base = reference_with(EXERCISE)


class Engine(base.Engine):
    def run_model(self, scheduled):
        return base.paged.Engine.run_model(self, scheduled)


base.Engine = Engine
globals().update(public_names(base))
