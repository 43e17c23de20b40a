"""top-p keeps only the tokens whose cumulative probability stays BELOW p: the token that crosses p is
dropped (and with a tiny p nothing but the first token is left by the minimum-one rule)."""

import torch

from solutions.ex6_decoding import FILTERED
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6a"  # the checker's part that catches it


def apply_top_p(logits, top_ps):
    ordered, order = logits.sort(dim=1, descending=True)
    mass = ordered.softmax(dim=1).cumsum(dim=1)
    dropped = mass >= torch.as_tensor(top_ps, dtype=logits.dtype).view(-1, 1)  # the bug: drops the crossing token
    dropped[:, 0] = False
    return logits.masked_fill(dropped.scatter(1, order, dropped), FILTERED)


globals().update(public_names(reference_with(EXERCISE, apply_top_p=apply_top_p)))
