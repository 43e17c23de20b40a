"""The shards are built as new nn.Linear layers of torch's default dtype and the weights copied in, not with
linear_from (which keeps the weights' dtype): a float16 or bfloat16 model's rank holds float32 copies (twice
the memory the split was to save) and its forward mixes dtypes."""

import torch
from torch import nn

from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_differential_9a"  # the check that catches it


def linear_from(weight, bias=None):
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None, device=weight.device)  # the bug: no dtype=
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


globals().update(public_names(reference_with(EXERCISE, linear_from=linear_from)))
