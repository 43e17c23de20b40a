"""BlockTable.slot_mapping computes the right slots, vectorised, but returns them as a tensor instead of the list of
Python ints the stub promises: each element reads as its int (tensor(3) == 3), yet a caller that keys a dict by a
slot, or serialises it, gets tensors."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "5a_differential"  # the check that catches it
_copy = reference_with(EXERCISE)


def slot_mapping(self, start, end):
    positions = torch.arange(start, end)
    blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // self.block_size]
    return blocks * self.block_size + positions % self.block_size  # the bug: no .tolist()


_copy.BlockTable.slot_mapping = slot_mapping
globals().update(public_names(_copy))
