"""pack() builds the causal mask from each query's index within its chunk instead of its position
(key j visible iff j <= i): right for a prefill from position 0, but a decode token or a later chunk
sees only the first keys of its sequence (exercise 2's trap, in chunked prefill)."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "5b"  # the check that catches it
torch = reference.torch


def pack(token_ids, start_positions, block_tables, block_size, device):
    input_ids, position_ids, batch = reference.pack(token_ids, start_positions, block_tables, block_size, device)
    longest = batch.query_index.shape[1]
    keys = batch.block_tables.shape[1] * block_size
    index = torch.arange(longest, device=device).masked_fill(~batch.query_valid, 0)  # [S, longest]: index within the chunk
    batch.mask = (torch.arange(keys, device=device) <= index[:, :, None])[:, None]  # the bug: not the query's position
    return input_ids, position_ids, batch


globals().update(public_names(reference_with(EXERCISE, pack=pack)))
