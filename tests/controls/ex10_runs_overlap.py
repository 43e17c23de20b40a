"""Paged Flash-Decoding whose runs take blocks_per_chunk + 1 table entries (an off-by-one at the chunk boundary),
cut back to the chunk's slots: right numbers, but the block at every boundary is read twice."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10c_paged_reads_only_its_blocks"  # the check that catches it


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    blocks = torch.as_tensor(block_table, dtype=torch.long, device=key_pool.device)[:-(-length // block_size)]
    chunk_tokens = blocks_per_chunk * block_size
    outputs, lses = [], []
    for start in range(0, length, chunk_tokens):
        run = blocks[start // block_size:start // block_size + blocks_per_chunk + 1]  # the bug: one entry too many
        valid = min(length - start, chunk_tokens)
        k = key_pool[run].flatten(0, 1)[:valid].transpose(0, 1)  # [H, valid, d]: the extra block is cut off again
        v = value_pool[run].flatten(0, 1)[:valid].transpose(0, 1)
        out, lse = _attend_chunk(q[:, None], k, v)
        outputs.append(out[:, 0])
        lses.append(lse[:, 0])
    out, _ = merge_partials(torch.stack(outputs), torch.stack(lses))
    return out


globals().update(public_names(reference_with(EXERCISE, paged_flash_decoding=paged_flash_decoding)))
