"""accept_sampled draws its acceptance tests with torch's global random state (torch.rand without the
generator): the distributions are right, but the same generator state no longer gives the same output."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7c_no_drafts_and_the_generator_only"  # the check that catches it


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if torch.rand(1).item() * q[token] < p[token]:  # the bug: torch's global random state
            continue
        residual = (p - q).clamp(min=0)
        if residual.sum() <= 0:
            residual = p
        return list(draft_tokens[:i]) + [torch.multinomial(residual, 1, generator=generator).item()]
    return list(draft_tokens) + [torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()]


globals().update(public_names(reference_with(EXERCISE, accept_sampled=accept_sampled)))
