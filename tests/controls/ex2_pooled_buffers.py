"""A preallocated KV cache that saves allocations by keeping its buffers in a pool shared by every cache (one
buffer per layer, reused by the next KVCache): right while one cache is used at a time, wrong as soon as two are
alive together (the second one writes over the first one's keys and values)."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
PART = "test_differential_cache"  # the check that catches it: the control runner runs only that

_POOL = {}  # the bug: (layer, shape, dtype, device) -> buffers, shared by every cache


class KVCache:
    def __init__(self, n_layer):
        self.lengths = [0] * n_layer

    def __len__(self):
        return self.lengths[0]

    def update(self, layer, k, v):
        start, end = self.lengths[layer], self.lengths[layer] + k.shape[2]
        B, H, _, D = k.shape
        key = (layer, B, H, D, k.dtype, k.device)
        if key not in _POOL or end > _POOL[key][0].shape[2]:
            capacity = max(1024, 2 * end)
            grown = tuple(t.new_zeros(B, H, capacity, D) for t in (k, v))
            if key in _POOL:
                for new, old in zip(grown, _POOL[key]):
                    new[:, :, :start] = old[:, :, :start]
            _POOL[key] = grown
        keys, values = _POOL[key]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.lengths[layer] = end
        return keys[:, :, :end], values[:, :, :end]


globals().update(public_names(reference_with(EXERCISE, KVCache=KVCache)))
