"""Paged Flash-Decoding that takes length // block_size + 1 blocks from the table: one block too many when the
length is an exact multiple of the block size (its slots are then cut off: the numbers stay right, but a
block of someone else's is read)."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10c_paged_reads_only_its_blocks"  # the check that catches it


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    blocks = torch.as_tensor(block_table, dtype=torch.long, device=key_pool.device)[:length // block_size + 1]  # the bug
    chunk_tokens = blocks_per_chunk * block_size
    outputs, lses = [], []
    for first in range(0, len(blocks), blocks_per_chunk):
        start = first * block_size
        run = blocks[first:first + blocks_per_chunk]
        k = key_pool[run].flatten(0, 1)[:max(length - start, 0)].transpose(0, 1)  # [H, valid, d]
        v = value_pool[run].flatten(0, 1)[:max(length - start, 0)].transpose(0, 1)
        if k.shape[1]:
            out, lse = _attend_chunk(q[:, None], k, v)
            outputs.append(out[:, 0])
            lses.append(lse[:, 0])
    out, _ = merge_partials(torch.stack(outputs), torch.stack(lses))
    return out


globals().update(public_names(reference_with(EXERCISE, paged_flash_decoding=paged_flash_decoding)))
