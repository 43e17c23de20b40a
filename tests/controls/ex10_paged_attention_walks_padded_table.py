"""Exercise 5's paged attention by Flash-Decoding that walks the sequence's padded block table in runs of two blocks,
masking each query's keys with batch.mask, until a run holds no key the query sees: right numbers, but a last
run that straddles the query's length reads the table's next entry, a block that is not the sequence's."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10d_long"  # the check that catches it


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    out = torch.empty_like(q)
    key_pool, value_pool = cache.keys[layer], cache.values[layer]
    block_size = key_pool.shape[1]
    chunk_tokens = blocks_per_chunk * block_size
    for s in range(batch.query_index.shape[0]):
        table = batch.block_tables[s]
        for j in torch.nonzero(batch.query_valid[s]).flatten().tolist():
            i, sees = batch.query_index[s, j], batch.mask[s, 0, j]  # [L]: the keys the query may see
            outputs, lses = [], []
            for start in range(0, len(table) * block_size, chunk_tokens):
                if not sees[start]:
                    break  # no key of this run is seen, nor of any later one
                run = table[start // block_size:start // block_size + blocks_per_chunk]  # the bug: may be past the length
                k = key_pool[run].flatten(0, 1).transpose(0, 1)  # [H, whole blocks, d]
                v = value_pool[run].flatten(0, 1).transpose(0, 1)
                scores = (q[i][:, None] @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [H, 1, n]
                scores = scores.masked_fill(~sees[start:start + k.shape[1]], NEG_INF)
                outputs.append((torch.softmax(scores, dim=-1) @ v)[:, 0])
                lses.append(torch.logsumexp(scores, dim=-1)[:, 0])
            out[i] = merge_partials(torch.stack(outputs), torch.stack(lses))[0]
    return out


globals().update(public_names(reference_with(EXERCISE, flash_paged_attention=flash_paged_attention)))
