"""Paged Flash-Decoding that first gathers the sequence's whole block table into one tensor, then splits that
into chunks: right numbers, but the whole sequence's keys at once (what the split was meant to avoid)."""

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import _attend_chunk, merge_partials

EXERCISE = "ex10_attention"
PART = "test_10c_paged_one_chunk"  # the check that catches it


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    blocks = torch.as_tensor(block_table, dtype=torch.long)[:-(-length // block_size)]
    keys = key_pool[blocks].flatten(0, 1)[:length].transpose(0, 1)  # the bug: [H, length, d], the whole sequence
    values = value_pool[blocks].flatten(0, 1)[:length].transpose(0, 1)
    chunk_tokens = blocks_per_chunk * block_size
    partials = [_attend_chunk(q[:, None], keys[:, s:s + chunk_tokens], values[:, s:s + chunk_tokens])
                for s in range(0, length, chunk_tokens)]
    out, _ = merge_partials(torch.stack([o[:, 0] for o, _ in partials]), torch.stack([lse[:, 0] for _, lse in partials]))
    return out


globals().update(public_names(reference_with(EXERCISE, paged_flash_decoding=paged_flash_decoding)))
