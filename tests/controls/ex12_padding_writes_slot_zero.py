"""Attention writes the keys and values of all `size` rows, the padding's at slot 0 (its slot mapping padded with
zeros, as a padded decode batch would be without a scratch block): the real rows' logits are right, but block 0,
which a sequence may own, is overwritten by padding."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex12_piecewise_graphs"
PART = "12a"

base = reference_with(EXERCISE)


def attend(attn, cache, layer, inputs, n, groups):
    base_attend(attn, cache, layer, inputs, n, groups)
    size = int(inputs.size)  # the padded step's rows, as fill left them
    if size > n:  # the bug: the padding rows' keys and values go to slot 0
        C = inputs.attn.shape[1]
        _, k, v = (t.view(size, attn.n_head, C // attn.n_head) for t in inputs.qkv[:size].split(C, dim=1))
        cache.write(layer, k[n:], v[n:], torch.zeros(size - n, dtype=torch.long, device=k.device))


class StepInputs(base.StepInputs):
    def fill(self, input_ids, positions, size):
        super().fill(input_ids, positions, size)
        self.size = torch.tensor(size)


base_attend = base.attend
base.attend, base.StepInputs = attend, StepInputs
globals().update(public_names(base))
