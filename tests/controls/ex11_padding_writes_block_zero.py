"""Padded rows write to slot 0 and attend to it, through block 0: a block the allocator hands out like any other,
so a padded row overwrites a key and value a sequence owns."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_fill_copies_in_place_and_pads_to_the_scratch_block"

base = reference_with(EXERCISE)


class StaticInputs(base.StaticInputs):
    def fill(self, token_ids, positions, block_tables, size):
        super().fill(token_ids, positions, block_tables, size)
        n = len(token_ids)
        self.slots[n:size] = 0  # the bug: the first slot of the pool, not the scratch block
        self.block_tables[n:size] = 0


base.StaticInputs = StaticInputs
globals().update(public_names(base))
