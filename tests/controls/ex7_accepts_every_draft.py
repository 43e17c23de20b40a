"""Verification that accepts every draft token: greedy keeps all k and adds the target's token after
them, rejection sampling never rejects."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7b"  # the checker's part that catches it


def accept_greedy(draft_tokens, target_logits):
    return list(draft_tokens) + [target_logits[len(draft_tokens)].argmax().item()]  # the bug: no comparison


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    return list(draft_tokens) + [torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()]


globals().update(public_names(reference_with(EXERCISE, accept_greedy=accept_greedy, accept_sampled=accept_sampled)))
