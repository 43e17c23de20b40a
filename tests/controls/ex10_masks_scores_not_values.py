"""Paged Flash-Decoding that reads whole blocks and masks the scores of the slots at or past the length with -inf,
but multiplies their values by the zero weights: stale slots may hold anything, and 0 * NaN is NaN."""

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
        k = key_pool[run].flatten(0, 1).transpose(0, 1)  # [H, whole blocks, d]
        v = value_pool[run].flatten(0, 1).transpose(0, 1)
        s = (q[:, None] @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [H, 1, n]
        s = s.masked_fill(torch.arange(start, start + k.shape[1], device=q.device) >= length, NEG_INF)
        outputs.append((torch.softmax(s, dim=-1) @ v)[:, 0])  # the bug: weight 0 times a stale value
        lses.append(torch.logsumexp(s, dim=-1)[:, 0])
    out, _ = merge_partials(torch.stack(outputs), torch.stack(lses))
    return out


globals().update(public_names(reference_with(EXERCISE, paged_flash_decoding=paged_flash_decoding)))
