"""Online softmax that keeps the last chunk's max as m instead of the max of every chunk so far."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10a"  # the check that catches it


def softmax_stats(chunks):
    m = l = None
    for chunk in chunks:
        chunk_max = chunk.amax(dim=-1)
        m_new = chunk_max  # the bug: the max of this chunk only
        safe = torch.where(m_new == NEG_INF, 0.0, m_new)  # a row still all -inf: exp(-inf - 0) = 0, not NaN
        scaled = torch.exp(chunk - safe[:, None]).sum(dim=-1)
        l = scaled if l is None else l * torch.exp(m - safe) + scaled  # the old sum, rescaled to the new max
        m = m_new
    return m, l


globals().update(public_names(reference_with(EXERCISE, softmax_stats=softmax_stats)))
