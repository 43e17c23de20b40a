"""A continuous batcher whose RunningBatch.add pads the narrower batch's keys and values with zeros of a fixed
[rows, 4, missing, 32]: the tiny model's 4 heads of width 32, read off a printout, not off the tensor. On tiny
every check passes; a model with another number of heads or another head width cannot join two batches."""

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that
N_HEAD, HEAD_DIM = 4, 32  # the bug: tiny's shapes


def _pad_left(t, width):
    if t.dim() == 2:
        return reference._pad_left(t, width)
    missing = width - t.shape[2]
    if missing == 0:
        return t
    return reference.torch.cat([t.new_zeros(t.shape[0], N_HEAD, missing, HEAD_DIM), t], dim=2)


globals().update(public_names(reference_with(EXERCISE, _pad_left=_pad_left)))
