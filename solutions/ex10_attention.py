"""Exercise 10: attention kernels, FlashAttention for prefill, Flash-Decoding for decode.

Attention is softmax(Q K^T / sqrt(d)) V. Written as three steps it materialises the T x T scores in
the GPU's slow memory (HBM) and reads them back twice: for long sequences those bytes, not the
arithmetic, set the time (attention is memory-bound). FlashAttention (Dao et al., 2022) never writes
the scores: it walks over tiles of keys and values, keeping for each query only a running max, a
running sum and a running output, rescaled whenever the max grows (the online softmax). The decode
step has one query per sequence: one tile of queries, nothing to run in parallel but the keys, so
Flash-Decoding (Dao et al., 2023) splits the keys into chunks, attends to each on its own, and merges
the partial outputs with their log-sum-exps. Serving engines run it over the paged KV blocks.

The parts, each graded on its own:
  10a softmax_stats: the online softmax, a row's max and sum of exponentials from its chunks
  10b flash_attention: the tiled forward, through workshop.attention.HBM, which counts the bytes moved
  10c merge_partials, flash_decoding, paged_flash_decoding: split-KV decoding, contiguous and paged
  10d flash_paged_attention: exercise 5's paged_attention done by 10c, for exercise 5's engine
"""

import contextlib
import math

import torch

from gpt import check_indices
from workshop.attention import HBM  # the memory model 10b works through (given)

NEG_INF = float("-inf")

# ----------------------------------------------------------------------------------------------
# 10a: the online softmax


def softmax_stats(chunks):
    """The softmax statistics of rows seen one chunk at a time. chunks: an iterable of tensors [R, n_i],
    the columns of the same R rows from left to right, each chunk seen once. Returns (m, l), each [R]:
    m the max of each row, l = sum over the row of exp(x - m). A row of only -inf: m = -inf, l = 0."""
    m = l = None
    for chunk in chunks:
        chunk_max = chunk.amax(dim=-1)
        m_new = chunk_max if m is None else torch.maximum(m, chunk_max)
        safe = torch.where(m_new == NEG_INF, 0.0, m_new)  # a row still all -inf: exp(-inf - 0) = 0, not NaN
        scaled = torch.exp(chunk - safe[:, None]).sum(dim=-1)
        l = scaled if l is None else l * torch.exp(m - safe) + scaled  # the old sum, rescaled to the new max
        m = m_new
    return m, l


def online_softmax(x, chunk_size):
    """Given: softmax of x [R, n] along its rows, from the statistics of chunk_size columns at a time."""
    m, l = softmax_stats(x.split(chunk_size, dim=-1))
    return torch.exp(x - m[:, None]) / l[:, None]


# ----------------------------------------------------------------------------------------------
# 10b: FlashAttention, forward


def flash_attention(hbm, block_q, block_k):
    """Attention of hbm's q over its k, v (causal or not, as hbm.causal says: exercise 2's lower-right mask),
    in tiles of block_q queries and block_k keys, never materialising the scores: every output row
    stored in hbm's "o". Equal to SDPA; moves at most workshop.attention.flash_attention_bytes."""
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q={block_q}, block_k={block_k}: a tile holds at least one query and one key.")
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    offset = Tk - Tq  # query i sits at position offset + i
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        q = hbm.load("q", i0, i1) * d ** -0.5
        m = torch.full((B, H, i1 - i0, 1), NEG_INF, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q)
        visible = offset + i1 if hbm.causal else Tk  # keys past the tile's last query: tiles skipped
        for j0 in range(0, min(visible, Tk), block_k):
            j1 = min(j0 + block_k, Tk)
            k, v = hbm.load("k", j0, j1), hbm.load("v", j0, j1)
            s = q @ k.transpose(-1, -2)
            if hbm.causal and j1 - 1 > offset + i0:  # the tile crosses the diagonal: mask inside it
                query_pos = torch.arange(offset + i0, offset + i1, device=q.device)[:, None]
                s = s.masked_fill(torch.arange(j0, j1, device=q.device) > query_pos, NEG_INF)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # finite: key 0 is visible to every query
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)  # how much the old max overstated: old terms shrink
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v
            m = m_new
        hbm.store("o", i0, acc / l)


def attention(q, k, v, block_q=64, block_k=64, causal=True):
    """Given: flash_attention on tensors: q [B, H, Tq, d], k, v [B, H, Tk, d] -> [B, H, Tq, d]."""
    hbm = HBM(q, k, v, causal)
    flash_attention(hbm, block_q, block_k)
    return hbm.output


# ----------------------------------------------------------------------------------------------
# 10c: Flash-Decoding (split-KV)


def _attend_chunk(q, k, v, valid=None):
    """One query row per leading index: q [..., 1, d], k, v [..., n, d] (only the first `valid` keys count)
    -> the chunk's normalised output [..., 1, d] and its log-sum-exp [..., 1]."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [..., 1, n]
    if valid is not None and valid < k.shape[-2]:
        s[..., valid:] = NEG_INF
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def merge_partials(outputs, lses):
    """Merge the partial attentions of chunks of the same keys. outputs: [n, ..., d] (chunk c's output,
    normalised over its own keys), lses: [n, ...] (chunk c's log-sum-exp of scores). Returns (output
    [..., d], lse [...]): what attention over all the chunks' keys together gives."""
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse)  # each chunk's share of the whole softmax's mass
    return (weights[..., None] * outputs).sum(dim=0), lse


def flash_decoding(q, k, v, chunk_size):
    """Decode attention split over the keys: q [B, H, 1, d] (one query per sequence, which sees every key),
    k, v [B, H, T, d], T cut into chunks of chunk_size keys (the last may be shorter), each attended on
    its own, then merged. Returns [B, H, 1, d], equal to SDPA."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: a chunk holds at least one key.")
    partials = [_attend_chunk(q, k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]) for s in range(0, k.shape[2], chunk_size)]
    out, _ = merge_partials(torch.stack([o for o, _ in partials]), torch.stack([lse for _, lse in partials]))
    return out


def check_paged_call(key_pool, block_table, length, blocks_per_chunk):
    """Given: paged_flash_decoding's arguments checked on the host before any kernel reads the pool with them (out of
    range, a GPU's index kernel asserts and the process dies): a ValueError naming the value and the limit."""
    block_size, num_blocks = key_pool.shape[1], key_pool.shape[0]
    if blocks_per_chunk < 1 or not 1 <= length <= len(block_table) * block_size:
        raise ValueError(f"length={length}, blocks_per_chunk={blocks_per_chunk}, a table of {len(block_table)} blocks of {block_size}: "
                         f"the length must be 1 to {len(block_table) * block_size} and a chunk at least one block.")
    used = block_table[:-(-length // block_size)]  # the blocks the sequence's keys are in (a CPU tensor's are checked)
    check_indices(used if isinstance(used, torch.Tensor) else list(used), num_blocks, "block_table entry",
                  f"the pool has {num_blocks} blocks")


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    """Flash-Decoding over exercise 5's paged pool: q [H, d], the query of one sequence at position
    length - 1; key_pool, value_pool [num_blocks, block_size, H, d]; block_table: the sequence's physical
    blocks in order (a list or 1-D tensor, possibly longer than needed), of which the first `length`
    slots hold its keys. Each chunk is a run of blocks_per_chunk blocks, read from the pool on its own:
    never the whole sequence at once, and no slot at or past `length`. Returns [H, d]."""
    check_paged_call(key_pool, block_table, length, blocks_per_chunk)
    block_size = key_pool.shape[1]
    blocks = torch.as_tensor(block_table, dtype=torch.long, device=key_pool.device)[:-(-length // block_size)]
    chunk_tokens = blocks_per_chunk * block_size
    outputs, lses = [], []
    for start in range(0, length, chunk_tokens):
        run = blocks[start // block_size:start // block_size + blocks_per_chunk]
        valid = min(length - start, chunk_tokens)  # the last chunk's last block may be partly filled
        k = key_pool[run].flatten(0, 1)[:valid].transpose(0, 1)  # [H, valid, d]: the run's slots, in order
        v = value_pool[run].flatten(0, 1)[:valid].transpose(0, 1)
        out, lse = _attend_chunk(q[:, None], k, v)
        outputs.append(out[:, 0])
        lses.append(lse[:, 0])
    out, _ = merge_partials(torch.stack(outputs), torch.stack(lses))
    return out


# ----------------------------------------------------------------------------------------------
# 10d: exercise 5's engine on Flash-Decoding


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    """Exercise 5's paged_attention(q, cache, layer, batch) done with paged_flash_decoding: each query of
    the packed batch q [N, n_head, head_dim] attends to its sequence's keys up to its own position (a
    prompt chunk's queries each see one more than the one before), found through batch.block_tables,
    never gathered whole. Returns [N, n_head, head_dim], equal to exercise 5's gather path."""
    out = torch.empty_like(q)
    seen = batch.mask[:, 0].sum(dim=-1)  # [S, longest chunk]: keys each query may see = its position + 1
    for s in range(batch.query_index.shape[0]):
        for j in torch.nonzero(batch.query_valid[s]).flatten().tolist():
            i = batch.query_index[s, j]
            out[i] = paged_flash_decoding(q[i], cache.keys[layer], cache.values[layer], batch.block_tables[s],
                                          int(seen[s, j]), blocks_per_chunk)
    return out


@contextlib.contextmanager
def use_flash_decoding(engine_module, blocks_per_chunk=2):
    """Given: inside the `with`, exercise 5's module (its engine, forward and attention_forward) attends with
    flash_paged_attention instead of its own paged_attention; restored afterwards.

        with use_flash_decoding(ex5):
            result = ex5.generate(model, requests, max_batch_size=4)
    """
    original = engine_module.paged_attention
    engine_module.paged_attention = lambda q, cache, layer, batch: flash_paged_attention(q, cache, layer, batch, blocks_per_chunk)
    try:
        yield
    finally:
        engine_module.paged_attention = original
