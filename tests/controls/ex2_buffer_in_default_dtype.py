"""A preallocated KV cache whose buffers are made in the default dtype (torch.zeros without dtype=): right for a
float32 model, but a float16 or bfloat16 model's keys and values come back as float32 (twice the memory, and
attention then mixes a half-precision query with float32 keys)."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
PART = "test_differential_cache"  # the check that catches it: the control runner runs only that


class KVCache:
    def __init__(self, n_layer):
        self.buffers = [None] * n_layer
        self.lengths = [0] * n_layer

    def __len__(self):
        return self.lengths[0]

    def update(self, layer, k, v):
        start, end = self.lengths[layer], self.lengths[layer] + k.shape[2]
        if self.buffers[layer] is None or end > self.buffers[layer][0].shape[2]:
            capacity = max(64, 2 * end)
            B, H, _, D = k.shape
            grown = tuple(torch.zeros(B, H, capacity, D, device=k.device) for _ in (k, v))  # the bug: no dtype=k.dtype
            if self.buffers[layer] is not None:
                for new, old in zip(grown, self.buffers[layer]):
                    new[:, :, :start] = old[:, :, :start]
            self.buffers[layer] = grown
        keys, values = self.buffers[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.lengths[layer] = end
        return keys[:, :, :end], values[:, :, :end]


globals().update(public_names(reference_with(EXERCISE, KVCache=KVCache)))
