"""Online softmax that first turns the chunks into a list (to count them), then folds them in: every tensor it
makes is one chunk's size, but every chunk stays in memory until the end."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10a_one_chunk_at_a_time"  # the check that catches it


def softmax_stats(chunks):
    chunks = list(chunks)  # the bug: all of them kept
    m = torch.full((chunks[0].shape[0],), NEG_INF, dtype=chunks[0].dtype)
    l = torch.zeros_like(m)
    for chunk in chunks:
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        safe = torch.where(m_new == NEG_INF, 0.0, m_new)
        l = l * torch.exp(m - safe) + torch.exp(chunk - safe[:, None]).sum(dim=-1)
        m = m_new
    return m, l


globals().update(public_names(reference_with(EXERCISE, softmax_stats=softmax_stats)))
