"""Online softmax whose running max starts at 0 instead of -inf, rows that summed to 0 reported as m = -inf: wrong m
for every row whose values are all below zero, and l = 0 for a row far below zero."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10a_softmax_stats_equal_the_whole_row"  # the check that catches it


def softmax_stats(chunks):
    m = l = None
    for chunk in chunks:
        if m is None:
            m = l = torch.zeros(chunk.shape[0], dtype=chunk.dtype, device=chunk.device)  # the bug: the max starts at 0
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        l = l * torch.exp(m - m_new) + torch.exp(chunk - m_new[:, None]).sum(dim=-1)
        m = m_new
    return torch.where(l == 0, NEG_INF, m), l  # rows of only -inf: as the contract says


globals().update(public_names(reference_with(EXERCISE, softmax_stats=softmax_stats)))
