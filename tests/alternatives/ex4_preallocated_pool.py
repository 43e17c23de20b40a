"""Continuous batching on a preallocated KV pool, as real engines preallocate theirs: every layer's keys
and values live in one buffer [capacity rows, n_head, capacity columns, head_dim] that grows by doubling
and never shrinks. Rows that leave are compacted to the top in place, dead columns are shifted out in
place, and each decode step writes its keys and values into the next free column (no concatenation).
The pool keeps its capacity after rows leave: its memory is bounded by the peak batch, not trimmed."""

import torch

import solutions.ex4_continuous_batching as reference
from solutions.ex2_kv_cache import forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex4_continuous_batching"
MIN_ROWS, MIN_COLUMNS = 4, 32


class _PoolCache:
    """What forward() needs of a KV cache, over the first `rows` rows of the pool: len() is the
    number of columns filled; update() writes the new column in place and returns views."""

    def __init__(self, pool, rows):
        self.pool, self.rows = pool, rows

    def __len__(self):
        return self.pool.width

    def update(self, layer, k, v):
        width, rows = self.pool.width, self.rows
        self.pool.keys[layer][:rows, :, width:width + k.shape[2]] = k
        self.pool.values[layer][:rows, :, width:width + v.shape[2]] = v
        end = width + k.shape[2]
        return self.pool.keys[layer][:rows, :, :end], self.pool.values[layer][:rows, :, :end]


class RunningBatch:
    """Row i of the pool belongs to seqs[i]; columns [0, width) are in use, every row right-aligned at
    column width - 1, and `mask` is False wherever a row has no key of its own."""

    def __init__(self, n_layer, device):
        self.seqs, self.n_layer, self.device = [], n_layer, device
        self.keys = self.values = None  # allocated at the first join, from the prefill's dtype and shape
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=device)
        self.width = 0

    def __len__(self):
        return len(self.seqs)

    def _reserve(self, rows, columns, like):
        """Make the pool hold at least rows x columns, doubling what it lacks; keep what it holds."""
        cap_rows, cap_columns = self.mask.shape
        if self.keys is not None and rows <= cap_rows and columns <= cap_columns:
            return
        new_rows = cap_rows if rows <= cap_rows else max(rows, 2 * cap_rows, MIN_ROWS)
        new_columns = cap_columns if columns <= cap_columns else max(columns, 2 * cap_columns, MIN_COLUMNS)
        used, width = len(self.seqs), self.width
        shape = (new_rows, like.shape[1], new_columns, like.shape[3])
        keys = [like.new_zeros(shape) for _ in range(self.n_layer)]
        values = [like.new_zeros(shape) for _ in range(self.n_layer)]
        mask = torch.zeros(new_rows, new_columns, dtype=torch.bool, device=self.device)
        if self.keys is not None:
            for layer in range(self.n_layer):
                keys[layer][:used, :, :width] = self.keys[layer][:used, :, :width]
                values[layer][:used, :, :width] = self.values[layer][:used, :, :width]
            mask[:used, :width] = self.mask[:used, :width]
        self.keys, self.values, self.mask = keys, values, mask

    def add(self, seqs, kv_cache, mask):
        old, new, width_new = len(self.seqs), len(seqs), mask.shape[1]
        width = max(self.width, width_new)
        self._reserve(old + new, width, kv_cache.keys[0])
        shift = width - self.width
        if shift and old:  # the newcomers are wider: move the running rows right, in place
            for buffer in self.keys + self.values:
                buffer[:old, :, shift:width] = buffer[:old, :, :self.width].clone()
                buffer[:old, :, :shift] = 0
            self.mask[:old, shift:width] = self.mask[:old, :self.width].clone()
            self.mask[:old, :shift] = False
        gap = width - width_new
        for layer in range(self.n_layer):
            for buffer, theirs in ((self.keys[layer], kv_cache.keys[layer]), (self.values[layer], kv_cache.values[layer])):
                buffer[old:old + new, :, :gap] = 0
                buffer[old:old + new, :, gap:width] = theirs
        self.mask[old:old + new, :gap] = False
        self.mask[old:old + new, gap:width] = mask
        self.seqs, self.width = self.seqs + list(seqs), width

    def remove(self, done):
        keep = [row for row, seq in enumerate(self.seqs) if seq not in done]
        if len(keep) == len(self.seqs):
            return
        self.seqs = [self.seqs[row] for row in keep]
        if not keep:
            self.width = 0  # the capacity stays for the next joiners
            return
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        start = int(self.mask[rows, :self.width].any(dim=0).nonzero()[0])  # columns before it are padding in every row left
        width = self.width - start
        for buffer in self.keys + self.values:  # indexing with rows copies, so the in-place write is safe
            buffer[:len(keep), :, :width] = buffer[rows, :, start:self.width]
        self.mask[:len(keep), :width] = self.mask[rows, start:self.width]
        self.width = width

    @torch.no_grad()
    def decode(self, model):
        rows = len(self.seqs)
        self._reserve(rows, self.width + 1, self.keys[0])
        input_ids = torch.tensor([[seq.output_ids[-1]] for seq in self.seqs], device=self.device)
        position_ids = torch.tensor([[len(seq.request.prompt_ids) + len(seq.output_ids) - 1] for seq in self.seqs], device=self.device)
        self.mask[:rows, self.width] = True
        logits = forward(model, input_ids, position_ids, _PoolCache(self, rows), self.mask[:rows, :self.width + 1])
        self.width += 1
        return reference.next_tokens(logits[:, -1], self.seqs)


globals().update(public_names(reference_with(EXERCISE, RunningBatch=RunningBatch)))
