"""When every draft token is accepted, the round ends without the target's bonus token (its logits
were computed anyway): k tokens per target forward at best instead of k + 1."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7b"  # the checker's part that catches it


def accept_greedy(draft_tokens, target_logits):
    best = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == best[n]:
        n += 1
    if draft_tokens and n == len(draft_tokens):
        return list(draft_tokens)  # the bug: the bonus token is dropped
    return list(draft_tokens[:n]) + [best[n]]


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if torch.rand(1, generator=generator).item() * q[token] < p[token]:
            continue
        return list(draft_tokens[:i]) + [torch.multinomial((p - q).clamp(min=0), 1, generator=generator).item()]
    return list(draft_tokens) if draft_tokens else [torch.multinomial(target_probs[0], 1, generator=generator).item()]  # the bug


globals().update(public_names(reference_with(EXERCISE, accept_greedy=accept_greedy, accept_sampled=accept_sampled)))
