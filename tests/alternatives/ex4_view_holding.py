"""Continuous batching whose running batch trims with views: remove() picks the rows left with
index_select and drops the dead leading columns with narrow(), a view that keeps the wider tensor alive
until the next decode step's concatenation replaces it. An empty batch keeps its (empty) tensors and
the newcomers join them like any others. Memory stays bounded by the batch's recent width, though for
a step the batch holds more bytes than its rows need."""

import torch

import solutions.ex4_continuous_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"


class RunningBatch(reference.RunningBatch):
    def add(self, seqs, kv_cache, mask):
        if not self.seqs and self.kv_cache.keys[0] is None:  # nothing ever joined: no tensors to join yet
            self.kv_cache.keys = [k[:0] for k in kv_cache.keys]
            self.kv_cache.values = [v[:0] for v in kv_cache.values]
            self.mask = mask[:0]
        width = max(self.mask.shape[1], mask.shape[1])
        for layer in range(len(self.kv_cache.keys)):
            self.kv_cache.keys[layer] = torch.cat([reference._pad_left(self.kv_cache.keys[layer], width), reference._pad_left(kv_cache.keys[layer], width)])
            self.kv_cache.values[layer] = torch.cat([reference._pad_left(self.kv_cache.values[layer], width), reference._pad_left(kv_cache.values[layer], width)])
        self.mask = torch.cat([reference._pad_left(self.mask, width), reference._pad_left(mask, width)])
        self.seqs = self.seqs + list(seqs)

    def remove(self, done):
        keep = [row for row, seq in enumerate(self.seqs) if seq not in done]
        if len(keep) == len(self.seqs):
            return
        self.seqs = [self.seqs[row] for row in keep]
        rows = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, rows)
        used = mask.any(dim=0)
        start = int(used.nonzero()[0]) if keep else mask.shape[1]  # nobody left: no columns
        width = mask.shape[1] - start
        self.mask = mask.narrow(1, start, width)  # a view: the index_select's wider tensor stays alive
        for layer in range(len(self.kv_cache.keys)):
            self.kv_cache.keys[layer] = self.kv_cache.keys[layer].index_select(0, rows).narrow(2, start, width)
            self.kv_cache.values[layer] = self.kv_cache.values[layer].index_select(0, rows).narrow(2, start, width)


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch)))
