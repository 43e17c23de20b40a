"""apply_repetition_penalty builds each row's ids with torch.tensor(history): an empty history (a row with no
tokens yet) makes a float tensor, which cannot index, and the call fails where the reference penalises nothing."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_differential_6a_processors"  # the check that catches it


def apply_repetition_penalty(logits, histories, penalties):
    out = logits.clone()
    for i, (history, penalty) in enumerate(zip(histories, penalties)):
        ids = torch.tensor(sorted(set(history)))  # the bug: [] gives a float tensor
        scores = out[i, ids]
        out[i, ids] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return out


globals().update(public_names(reference_with(EXERCISE, apply_repetition_penalty=apply_repetition_penalty)))
