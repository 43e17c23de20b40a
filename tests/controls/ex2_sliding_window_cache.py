"""A KV cache that keeps only the last 64 positions (a sliding window): exact for short sequences, wrong
once a sequence grows past 64 tokens."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
WINDOW = 64


class KVCache:
    def __init__(self, n_layer):
        self.keys = [None] * n_layer
        self.values = [None] * n_layer

    def __len__(self):
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(self, layer, k, v):
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k[:, :, -WINDOW:], v[:, :, -WINDOW:]  # the bug: forgets older positions
        return k, v


globals().update(public_names(reference_with(EXERCISE, KVCache=KVCache)))
