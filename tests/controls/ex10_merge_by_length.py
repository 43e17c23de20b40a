"""Flash-Decoding that merges the chunks' outputs weighted by their number of keys instead of by exp(lse)."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10c_flash_decoding_equals_sdpa"  # the check that catches it


def flash_decoding(q, k, v, chunk_size):
    partials = [_attend_chunk(q, k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]) for s in range(0, k.shape[2], chunk_size)]
    sizes = [min(chunk_size, k.shape[2] - s) for s in range(0, k.shape[2], chunk_size)]
    return sum(n * o for n, (o, _) in zip(sizes, partials)) / k.shape[2]  # the bug: weights by length


globals().update(public_names(reference_with(EXERCISE, flash_decoding=flash_decoding)))
