"""Exercise 5's paged attention by Flash-Decoding in which every query of a sequence sees all of its keys
(right for decode steps, but a prompt chunk's early queries see the later tokens)."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10d"  # the check that catches it


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    out = torch.empty_like(q)
    seen = batch.mask[:, 0].sum(dim=-1)  # [S, longest chunk]: keys each query may see = its position + 1
    for s in range(batch.query_index.shape[0]):
        for j in torch.nonzero(batch.query_valid[s]).flatten().tolist():
            i = batch.query_index[s, j]
            out[i] = paged_flash_decoding(q[i], cache.keys[layer], cache.values[layer], batch.block_tables[s],
                                          int(seen[s].max()), blocks_per_chunk)  # the bug: the last query's length for all
    return out


globals().update(public_names(reference_with(EXERCISE, flash_paged_attention=flash_paged_attention)))
