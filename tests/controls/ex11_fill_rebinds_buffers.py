"""fill() makes new tensors for the step's values and binds them to the buffers' names: right values, and an eager
step reads them, but a captured graph still reads the tensors it was captured with and replays the first step's
values for ever."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_fill_copies_in_place_and_pads_to_the_scratch_block"

base = reference_with(EXERCISE)


class StaticInputs(base.StaticInputs):
    def fill(self, token_ids, positions, block_tables, size):
        fresh = {name: getattr(self, name).clone() for name in ("input_ids", "positions", "slots", "block_tables", "context_lens")}
        self.__dict__.update(fresh)  # the bug: new tensors each step
        super().fill(token_ids, positions, block_tables, size)


base.StaticInputs = StaticInputs
globals().update(public_names(base))
