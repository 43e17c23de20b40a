"""After a rejection, the replacement token is drawn from the target's p instead of the residual
normalize(max(p - q, 0)): tokens the draft already offers get counted twice, so the output is biased
towards them and no longer the target's distribution."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7c"  # the checker's part that catches it


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if torch.rand(1, generator=generator).item() * q[token] < p[token]:
            continue
        return list(draft_tokens[:i]) + [torch.multinomial(p, 1, generator=generator).item()]  # the bug: p, not max(p - q, 0)
    return list(draft_tokens) + [torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()]


globals().update(public_names(reference_with(EXERCISE, accept_sampled=accept_sampled)))
