"""Exercise 10, another correct design: log-space statistics everywhere (a running log-sum-exp instead of a
max and a sum), FlashAttention that visits the key tiles right to left (the diagonal tile first, so rows
that see no key of a tile are the rule) and merges each tile's normalised partial output as Flash-Decoding
does, Flash-Decoding with every chunk attended at once (keys padded and masked), a pairwise merge, paged
chunks read slot by slot through a slot mapping, and query lengths read off the mask's last True."""

import contextlib

import torch

from workshop.attention import HBM  # noqa: F401

NEG_INF = float("-inf")
EXERCISE = "ex10_attention"


def softmax_stats(chunks):
    lse = m = None
    for chunk in chunks:
        chunk_lse, chunk_max = torch.logsumexp(chunk, dim=-1), chunk.amax(dim=-1)
        lse = chunk_lse if lse is None else torch.logaddexp(lse, chunk_lse)
        m = chunk_max if m is None else torch.maximum(m, chunk_max)
    return m, torch.where(m == NEG_INF, 0.0, torch.exp(lse - m.masked_fill(m == NEG_INF, 0.0)))


def online_softmax(x, chunk_size):
    m, l = softmax_stats(x.split(chunk_size, dim=-1))
    return torch.exp(x - m[:, None]) / l[:, None]


def _fold(out, lse, tile_out, tile_lse):
    """Merge two normalised partial results; a side with lse = -inf (no key seen) weighs nothing."""
    new = torch.logaddexp(lse, tile_lse)
    safe = new.masked_fill(new == NEG_INF, 0.0)
    return out * torch.exp(lse - safe) + torch.nan_to_num(tile_out) * torch.exp(tile_lse - safe), new


def flash_attention(hbm, block_q, block_k):
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        q = hbm.load("q", i0, i1) / d ** 0.5
        out, lse = torch.zeros_like(q), torch.full((B, H, i1 - i0, 1), NEG_INF)
        last = Tk - Tq + i1 - 1 if hbm.causal else Tk - 1  # the last key any query of the tile sees
        for j0 in reversed(range(0, last + 1, block_k)):
            j1 = min(j0 + block_k, Tk)
            k, v = hbm.load("k", j0, j1), hbm.load("v", j0, j1)
            s = q @ k.transpose(-1, -2)
            if hbm.causal:
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > torch.arange(Tk - Tq + i0, Tk - Tq + i1)[:, None], NEG_INF)
            tile_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            out, lse = _fold(out, lse, torch.softmax(s, dim=-1) @ v, tile_lse)
        hbm.store("o", i0, out)


def attention(q, k, v, block_q=64, block_k=64, causal=True):
    hbm = HBM(q, k, v, causal)
    flash_attention(hbm, block_q, block_k)
    return hbm.output


def merge_partials(outputs, lses):
    out, lse = outputs[0], lses[0]
    for o, l in zip(outputs[1:], lses[1:]):
        out, lse = _fold(out, lse[..., None], o, l[..., None])
        lse = lse[..., 0]
    return out, lse


def flash_decoding(q, k, v, chunk_size):
    B, H, T, d = k.shape
    n = -(-T // chunk_size)
    pad = n * chunk_size - T
    k = torch.cat([k, k.new_zeros(B, H, pad, d)], dim=2).view(B, H, n, chunk_size, d)
    v = torch.cat([v, v.new_zeros(B, H, pad, d)], dim=2).view(B, H, n, chunk_size, d)
    s = (q[:, :, None] @ k.transpose(-1, -2)) / d ** 0.5  # [B, H, n, 1, chunk]: every chunk at once
    s = s.masked_fill(torch.arange(n * chunk_size).view(n, 1, chunk_size) >= T, NEG_INF)
    outputs = (torch.softmax(s, dim=-1) @ v).permute(2, 0, 1, 3, 4)  # [n, B, H, 1, d]
    out, _ = merge_partials(outputs, torch.logsumexp(s, dim=-1).permute(2, 0, 1, 3))
    return out


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    block_size = key_pool.shape[1]
    table = [int(b) for b in block_table]
    flat_k, flat_v = key_pool.flatten(0, 1), value_pool.flatten(0, 1)  # views: [slots, H, d]
    out = lse = None
    chunk = blocks_per_chunk * block_size
    for start in range(0, length, chunk):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(start, min(length, start + chunk))])
        k, v = flat_k[slots].transpose(0, 1), flat_v[slots].transpose(0, 1)  # [H, n, d]
        s = (k @ q[:, :, None])[..., 0] / q.shape[-1] ** 0.5  # [H, n]
        part, part_lse = (torch.softmax(s, dim=-1)[:, None] @ v)[:, 0], torch.logsumexp(s, dim=-1)  # [H, d], [H]
        if out is None:
            out, lse = part, part_lse
        else:
            out, lse = _fold(out, lse[:, None], part, part_lse[:, None])
            lse = lse[:, 0]
    return out


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    out = torch.empty_like(q)
    key_positions = torch.arange(batch.mask.shape[-1])
    for s in range(batch.query_index.shape[0]):
        for j in range(batch.query_index.shape[1]):
            if batch.query_valid[s, j]:
                length = int(key_positions[batch.mask[s, 0, j]].max()) + 1  # the last key the query sees, plus one
                i = int(batch.query_index[s, j])
                out[i] = paged_flash_decoding(q[i], cache.keys[layer], cache.values[layer], batch.block_tables[s].tolist(),
                                              length, blocks_per_chunk)
    return out


@contextlib.contextmanager
def use_flash_decoding(engine_module, blocks_per_chunk=2):
    original = engine_module.paged_attention
    engine_module.paged_attention = lambda q, cache, layer, batch: flash_paged_attention(q, cache, layer, batch, blocks_per_chunk)
    try:
        yield
    finally:
        engine_module.paged_attention = original
