"""FlashAttention that keeps one running max for the whole tile (every row, batch and head) instead of one per
query: exact on paper, but a row whose scores are far below the tile's largest sums exp(s - m) = 0 and returns NaN."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10b_scores_far_from_zero"  # the check that catches it


def flash_attention(hbm, block_q, block_k):
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
            m_new = torch.maximum(m, s.amax().expand_as(m))  # the bug: the max of the whole tile, not of each row  # finite: key 0 is visible to every query
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)  # how much the old max overstated: old terms shrink
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v
            m = m_new
        hbm.store("o", i0, acc / l)


globals().update(public_names(reference_with(EXERCISE, flash_attention=flash_attention)))
