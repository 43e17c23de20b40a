"""pack() gives each new token the slot of the position after it (p + 1): every key and value is
written one slot late, so a query never finds its own key and reads an unwritten slot instead."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "5b"  # the check that catches it


def pack(token_ids, start_positions, block_tables, block_size, device):
    input_ids, position_ids, batch = reference.pack(token_ids, start_positions, block_tables, block_size, device)
    slots = []
    for tokens, start, blocks in zip(token_ids, start_positions, block_tables):
        for p in range(start + 1, start + len(tokens) + 1):  # the bug: positions start+1 .. start+len
            slots.append(blocks[p // block_size] * block_size + p % block_size)
    batch.slots = reference.torch.tensor(slots, dtype=reference.torch.long, device=device)
    return input_ids, position_ids, batch


globals().update(public_names(reference_with(EXERCISE, pack=pack)))
