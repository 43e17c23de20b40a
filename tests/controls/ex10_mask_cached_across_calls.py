"""FlashAttention that caches each diagonal tile's mask in a module-level dict keyed by the tile's place and
sizes, but not by Tk - Tq: a later call with another query offset reuses a mask built for the first one
(state shared between calls that should not be)."""

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF

EXERCISE = "ex10_attention"
PART = "test_10b_differential"  # the check that catches it

_MASKS = {}


def flash_attention(hbm, block_q, block_k):
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    offset = Tk - Tq
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        q = hbm.load("q", i0, i1) * d ** -0.5
        m = torch.full((B, H, i1 - i0, 1), NEG_INF, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros_like(q)
        visible = offset + i1 if hbm.causal else Tk
        for j0 in range(0, min(visible, Tk), block_k):
            j1 = min(j0 + block_k, Tk)
            k, v = hbm.load("k", j0, j1), hbm.load("v", j0, j1)
            s = q @ k.transpose(-1, -2)
            if hbm.causal and j1 - 1 > offset + i0:
                key = (i0, i1, j0, j1)  # the bug: the offset is not part of the key
                if key not in _MASKS:
                    _MASKS[key] = torch.arange(j0, j1) > torch.arange(offset + i0, offset + i1)[:, None]
                s = s.masked_fill(_MASKS[key], NEG_INF)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p, rescale = torch.exp(s - m_new), torch.exp(m - m_new)
            l, acc, m = l * rescale + p.sum(dim=-1, keepdim=True), acc * rescale + p @ v, m_new
        hbm.store("o", i0, acc / l)


globals().update(public_names(reference_with(EXERCISE, flash_attention=flash_attention)))
