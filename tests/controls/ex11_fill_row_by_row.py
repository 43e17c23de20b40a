"""fill() writes each row's values one element at a time: right, but on a GPU every element is a copy from the
host of its own, a few hundred per step."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_fill_copies_once_per_buffer_whatever_the_batch"

base = reference_with(EXERCISE)


class StaticInputs(base.StaticInputs):
    def fill(self, token_ids, positions, block_tables, size):
        bs, scratch, width = self.block_size, self.scratch_block, self.block_tables.shape[1]
        for i in range(size):
            real = i < len(token_ids)
            p = positions[i] if real else 0
            table = block_tables[i] if real else []
            self.input_ids[i] = token_ids[i] if real else 0
            self.positions[i] = p
            self.slots[i] = table[p // bs] * bs + p % bs if real else scratch * bs
            self.context_lens[i] = p + 1
            self.block_tables[i] = torch.tensor(table + [scratch] * (width - len(table)))


base.StaticInputs = StaticInputs
globals().update(public_names(base))
