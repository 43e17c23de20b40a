"""Exercise 10, another correct design: base-2 exponentials (exp2 of scores pre-multiplied by log2(e), as GPU kernels
do) and lazy rescaling (FlashAttention-4's trick): the reference max a row's terms are taken against moves only when
a new score exceeds it by more than a threshold, so most tiles rescale nothing and the terms may grow to 2^8 before
they do. softmax_stats tracks the exact max beside that reference and converts at the end; Flash-Decoding folds its
chunks into one running, lazily rescaled state instead of keeping every partial for a merge at the end."""

import contextlib
import math

import torch

from workshop.attention import HBM  # noqa: F401

NEG_INF = float("-inf")
EXERCISE = "ex10_attention"
LOG2E = math.log2(math.e)
THRESHOLD = 8.0  # in log2 units: a term is at most 2^8 before the reference max moves


def _moved(ref, new_max, threshold, to_log2=1.0):
    """The reference max after seeing new_max: unchanged unless new_max exceeds it by more than the threshold
    (a reference still at -inf takes any new max). Returns (reference, the factor the old terms are multiplied by);
    to_log2 turns the values' units into log2 units (LOG2E for natural ones)."""
    ref_new = torch.where(new_max > ref + threshold, new_max, ref)
    safe_new = ref_new.masked_fill(ref_new == NEG_INF, 0.0)
    return ref_new, torch.exp2((ref - safe_new) * to_log2)  # 1 where nothing moved; 0 where the old reference was -inf


def softmax_stats(chunks):
    m = ref = l2 = None
    for chunk in chunks:
        chunk_max = chunk.amax(dim=-1)
        if m is None:
            m = torch.full_like(chunk_max, NEG_INF)
            ref, l2 = m.clone(), torch.zeros_like(chunk_max)
        m = torch.maximum(m, chunk_max)  # the exact max, for the answer
        ref, rescale = _moved(ref, chunk_max, THRESHOLD / LOG2E, LOG2E)  # natural units: a move of 8 in log2
        safe = ref.masked_fill(ref == NEG_INF, 0.0)
        l2 = l2 * rescale + torch.exp2((chunk - safe[:, None]) * LOG2E).sum(dim=-1)  # subtract first: exact near 1000
    safe_m, safe_ref = m.masked_fill(m == NEG_INF, 0.0), ref.masked_fill(ref == NEG_INF, 0.0)
    return m, l2 * torch.exp2((safe_ref - safe_m) * LOG2E)  # the sum against the exact max


def online_softmax(x, chunk_size):
    m, l = softmax_stats(x.split(chunk_size, dim=-1))
    return torch.exp(x - m[:, None]) / l[:, None]


def flash_attention(hbm, block_q, block_k):
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    offset = Tk - Tq
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        q = hbm.load("q", i0, i1) * (LOG2E / math.sqrt(d))  # scores come out in log2 units
        ref = torch.full((B, H, i1 - i0, 1), NEG_INF, dtype=q.dtype, device=q.device)
        l2, acc = torch.zeros_like(ref), torch.zeros_like(q)
        last_key = offset + i1 - 1 if hbm.causal else Tk - 1
        query_pos = torch.arange(offset + i0, offset + i1, device=q.device)[:, None]
        for j0 in range(0, last_key + 1, block_k):
            j1 = min(j0 + block_k, Tk)
            k, v = hbm.load("k", j0, j1), hbm.load("v", j0, j1)
            s2 = q @ k.transpose(-1, -2)
            if hbm.causal:
                s2 = s2.masked_fill(torch.arange(j0, j1, device=q.device) > query_pos, NEG_INF)
            ref, rescale = _moved(ref, s2.amax(dim=-1, keepdim=True), THRESHOLD)
            p = torch.exp2(s2 - ref.masked_fill(ref == NEG_INF, 0.0))
            l2 = l2 * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v
        hbm.store("o", i0, acc / l2)


def attention(q, k, v, block_q=64, block_k=64, causal=True):
    hbm = HBM(q, k, v, causal)
    flash_attention(hbm, block_q, block_k)
    return hbm.output


def merge_partials(outputs, lses):
    top = lses.amax(dim=0)
    safe = top.masked_fill(top == NEG_INF, 0.0)
    weights = torch.exp2((lses - safe) * LOG2E)  # [n, ...]
    total = weights.sum(dim=0)
    return (weights[..., None] * outputs).sum(dim=0) / total[..., None], safe + torch.log2(total) / LOG2E


class _Running:
    """One query row per leading index, fed chunks of its keys one after another, lazily rescaled in base 2."""

    def __init__(self, q):
        self.q = q * (LOG2E / math.sqrt(q.shape[-1]))  # [..., 1, d]
        self.ref = torch.full((*q.shape[:-1], 1), NEG_INF, dtype=q.dtype, device=q.device)
        self.l2, self.acc = torch.zeros_like(self.ref), torch.zeros_like(q)

    def add(self, k, v):
        s2 = self.q @ k.transpose(-1, -2)  # [..., 1, n]
        self.ref, rescale = _moved(self.ref, s2.amax(dim=-1, keepdim=True), THRESHOLD)
        p = torch.exp2(s2 - self.ref.masked_fill(self.ref == NEG_INF, 0.0))
        self.l2 = self.l2 * rescale + p.sum(dim=-1, keepdim=True)
        self.acc = self.acc * rescale + p @ v

    def output(self):
        return self.acc / self.l2


def flash_decoding(q, k, v, chunk_size):
    state = _Running(q)
    for start in range(0, k.shape[2], chunk_size):
        state.add(k[:, :, start:start + chunk_size], v[:, :, start:start + chunk_size])
    return state.output()


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    table = torch.as_tensor(block_table, dtype=torch.long, device=key_pool.device)
    state = _Running(q[:, None])  # [H, 1, d]
    for first in range(0, -(-length // block_size), blocks_per_chunk):
        run = table[first:min(first + blocks_per_chunk, -(-length // block_size))]
        n = min(length - first * block_size, len(run) * block_size)
        k = key_pool.index_select(0, run).flatten(0, 1)[:n].transpose(0, 1)  # [H, n, d]
        v = value_pool.index_select(0, run).flatten(0, 1)[:n].transpose(0, 1)
        state.add(k, v)
    return state.output()[:, 0]


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    out = torch.empty_like(q)
    lengths = batch.mask[:, 0].sum(dim=-1).tolist()  # [S][longest chunk]: the keys each query sees
    valid = batch.query_valid.tolist()
    for s, (row, index) in enumerate(zip(lengths, batch.query_index.tolist())):
        for j, (length, i) in enumerate(zip(row, index)):
            if valid[s][j]:
                out[i] = paged_flash_decoding(q[i], cache.keys[layer], cache.values[layer], batch.block_tables[s],
                                              int(length), blocks_per_chunk)
    return out


@contextlib.contextmanager
def use_flash_decoding(engine_module, blocks_per_chunk=2):
    original = engine_module.paged_attention
    engine_module.paged_attention = lambda q, cache, layer, batch: flash_paged_attention(q, cache, layer, batch, blocks_per_chunk)
    try:
        yield
    finally:
        engine_module.paged_attention = original
