"""Paged Flash-Decoding that attends to every slot of the blocks it reads: the last block's slots past the
sequence's length (someone else's, or stale) count too."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10c_paged_flash_decoding_equals_sdpa"  # the check that catches it


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    blocks = torch.as_tensor(block_table, dtype=torch.long, device=key_pool.device)[:-(-length // block_size)]
    chunk_tokens = blocks_per_chunk * block_size
    outputs, lses = [], []
    for start in range(0, length, chunk_tokens):
        run = blocks[start // block_size:start // block_size + blocks_per_chunk]
        valid = len(run) * block_size  # the bug: whole blocks, the last one too  # the last chunk's last block may be partly filled
        k = key_pool[run].flatten(0, 1)[:valid].transpose(0, 1)  # [H, valid, d]: the run's slots, in order
        v = value_pool[run].flatten(0, 1)[:valid].transpose(0, 1)
        out, lse = _attend_chunk(q[:, None], k, v)
        outputs.append(out[:, 0])
        lses.append(lse[:, 0])
    out, _ = merge_partials(torch.stack(outputs), torch.stack(lses))
    return out


globals().update(public_names(reference_with(EXERCISE, paged_flash_decoding=paged_flash_decoding)))
