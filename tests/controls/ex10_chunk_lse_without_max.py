"""Flash-Decoding whose chunks take their log-sum-exp as log(sum(exp(s))) without subtracting the max: inf once a
score passes about 88, -inf once every score of a chunk is below about -88 (then the merge divides 0 by 0)."""

import math  # noqa: F401

import torch

from tests.control_support import public_names, reference_with
from solutions.ex10_attention import NEG_INF, _attend_chunk, merge_partials  # noqa: F401

EXERCISE = "ex10_attention"
PART = "test_10c_scores_far_from_zero"  # the check that catches it


def _attend_chunk(q, k, v, valid=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [..., 1, n]
    if valid is not None and valid < k.shape[-2]:
        s[..., valid:] = NEG_INF
    lse = torch.log(torch.exp(s).sum(dim=-1))  # the bug: exp of the raw scores overflows (or underflows)
    return torch.softmax(s, dim=-1) @ v, lse


globals().update(public_names(reference_with(EXERCISE, _attend_chunk=_attend_chunk)))
