"""Exercise 10, another correct design: two online-softmax streams merged at the end, as a kernel that splits each
tile between two warps would. softmax_stats feeds the even chunks to one running (max, sum) and the odd ones to
another; FlashAttention gives the first half of every key tile to one stream and the second half to the other (so a
stream may see no key at all for a row: its max stays -inf, its sum 0), both read from the same K/V tile load;
Flash-Decoding, contiguous and paged, alternates its chunks between two running states; merge_partials folds
the chunks pairwise in a tree."""

import contextlib
import math

import torch

from workshop.attention import HBM  # noqa: F401

NEG_INF = float("-inf")
EXERCISE = "ex10_attention"


def _safe(m):
    return m.masked_fill(m == NEG_INF, 0.0)


def _merge_stats(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - _safe(m)) + l_b * torch.exp(m_b - _safe(m))


def softmax_stats(chunks):
    streams = []  # [(m, l)] for the even chunks and for the odd ones
    for c, chunk in enumerate(chunks):
        chunk_max = chunk.amax(dim=-1)
        if len(streams) < 2:
            streams.append((torch.full_like(chunk_max, NEG_INF), torch.zeros_like(chunk_max)))
        m, l = streams[c % 2]
        m_new = torch.maximum(m, chunk_max)
        l = l * torch.exp(m - _safe(m_new)) + torch.exp(chunk - _safe(m_new)[:, None]).sum(dim=-1)
        streams[c % 2] = (m_new, l)
    return _merge_stats(*streams[0], *streams[1]) if len(streams) == 2 else streams[0]


def online_softmax(x, chunk_size):
    m, l = softmax_stats(x.split(chunk_size, dim=-1))
    return torch.exp(x - m[:, None]) / l[:, None]


class _Stream:
    """A running max, sum and unnormalised output for a tile of query rows [..., rows, d]."""

    def __init__(self, like_q):
        self.m = torch.full((*like_q.shape[:-1], 1), NEG_INF, dtype=like_q.dtype, device=like_q.device)
        self.l, self.acc = torch.zeros_like(self.m), torch.zeros_like(like_q)

    def add(self, s, v):
        if s.shape[-1] == 0:
            return
        m_new = torch.maximum(self.m, s.amax(dim=-1, keepdim=True))
        safe = _safe(m_new)  # a row that has seen no key yet: every exp is 0, nothing NaN
        rescale, p = torch.exp(self.m - safe), torch.exp(s - safe)
        self.l = self.l * rescale + p.sum(dim=-1, keepdim=True)
        self.acc = self.acc * rescale + p @ v
        self.m = m_new

    @staticmethod
    def merged(a, b):
        m = torch.maximum(a.m, b.m)  # finite: every row saw some key in one of the two streams (the other weighs 0)
        wa, wb = torch.exp(a.m - m), torch.exp(b.m - m)
        return (a.acc * wa + b.acc * wb) / (a.l * wa + b.l * wb)


def flash_attention(hbm, block_q, block_k):
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    offset = Tk - Tq
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        q = hbm.load("q", i0, i1) / math.sqrt(d)
        first, second = _Stream(q), _Stream(q)
        visible = min(Tk, offset + i1) if hbm.causal else Tk
        for j0 in range(0, visible, block_k):
            j1 = min(j0 + block_k, Tk)
            k, v = hbm.load("k", j0, j1), hbm.load("v", j0, j1)  # one load; each stream takes half of it
            s = q @ k.transpose(-1, -2)
            if hbm.causal:
                query_pos = torch.arange(offset + i0, offset + i1, device=q.device)[:, None]
                s = s.masked_fill(torch.arange(j0, j1, device=q.device) > query_pos, NEG_INF)
            half = (j1 - j0 + 1) // 2
            first.add(s[..., :half], v[:, :, :half])
            second.add(s[..., half:], v[:, :, half:])
        hbm.store("o", i0, _Stream.merged(first, second))


def attention(q, k, v, block_q=64, block_k=64, causal=True):
    hbm = HBM(q, k, v, causal)
    flash_attention(hbm, block_q, block_k)
    return hbm.output


def merge_partials(outputs, lses):
    parts = list(zip(outputs, lses))
    while len(parts) > 1:  # a tree: neighbours merged pairwise, level by level
        merged = []
        for (o_a, lse_a), (o_b, lse_b) in zip(parts[0::2], parts[1::2]):
            lse = torch.logaddexp(lse_a, lse_b)
            merged.append((o_a * torch.exp(lse_a - lse)[..., None] + o_b * torch.exp(lse_b - lse)[..., None], lse))
        parts = merged + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def _two_streams(q, chunks):
    """q [..., 1, d]; chunks: (k, v) pairs [..., n, d], alternately fed to two running states."""
    streams = [_Stream(q), _Stream(q)]
    scale = 1 / math.sqrt(q.shape[-1])
    for c, (k, v) in enumerate(chunks):
        streams[c % 2].add((q @ k.transpose(-1, -2)) * scale, v)
    return _Stream.merged(*streams)  # a single chunk: the second stream saw nothing and weighs nothing


def flash_decoding(q, k, v, chunk_size):
    return _two_streams(q, ((k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]) for s in range(0, k.shape[2], chunk_size)))


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    table = [int(b) for b in block_table][:-(-length // block_size)]

    def chunks():
        for first in range(0, len(table), blocks_per_chunk):
            run = table[first:first + blocks_per_chunk]
            n = min(length - first * block_size, len(run) * block_size)
            k = torch.cat([key_pool[b] for b in run])[:n]  # [n, H, d]: the run's blocks, one by one
            v = torch.cat([value_pool[b] for b in run])[:n]
            yield k.transpose(0, 1), v.transpose(0, 1)

    return _two_streams(q[:, None], chunks())[:, 0]


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    out = torch.empty_like(q)
    positions = torch.arange(batch.mask.shape[-1], device=q.device)
    for s in range(batch.query_index.shape[0]):
        for j in range(batch.query_index.shape[1]):
            if batch.query_valid[s, j]:
                length = int(torch.where(batch.mask[s, 0, j], positions, -1).max()) + 1  # the last key seen, plus one
                out[batch.query_index[s, j]] = paged_flash_decoding(q[batch.query_index[s, j]], cache.keys[layer],
                                                                    cache.values[layer], batch.block_tables[s], length,
                                                                    blocks_per_chunk)
    return out


@contextlib.contextmanager
def use_flash_decoding(engine_module, blocks_per_chunk=2):
    original = engine_module.paged_attention
    engine_module.paged_attention = lambda q, cache, layer, batch: flash_paged_attention(q, cache, layer, batch, blocks_per_chunk)
    try:
        yield
    finally:
        engine_module.paged_attention = original
