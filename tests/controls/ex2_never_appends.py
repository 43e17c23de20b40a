"""A KV cache that keeps the prefill's keys and values but never appends the decoded tokens' ones."""

import torch

import solutions.ex2_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"


class KVCache(reference.KVCache):
    def update(self, layer, k, v):
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
            return k, v
        return torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)  # the bug: not stored


globals().update(public_names(reference_with(EXERCISE, KVCache=KVCache)))
