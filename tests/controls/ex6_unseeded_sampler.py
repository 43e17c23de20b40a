"""The sampler ignores the generators it is given and draws from torch's global random state: a seed
no longer reproduces a request, and a request's tokens depend on who else is in the batch."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6b"  # the checker's part that catches it


def draw_multinomial(probs, generators):
    return torch.multinomial(probs, 1).flatten().tolist()  # the bug: no generator


globals().update(public_names(reference_with(EXERCISE, draw_multinomial=draw_multinomial)))
