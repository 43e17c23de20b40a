"""The draft's cache is never rolled back: each round feeds only the tokens after what it has cached,
so the keys and values of rejected draft tokens stay in and the draft proposes from a wrong text.
The output stays the target's (verification fixes it), but the draft agrees less and less."""

import torch

from solutions.ex2_kv_cache import KVCache
from workshop.serving.sampling import GREEDY
from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7a"  # the checker's part that catches it

_reference = reference_with(EXERCISE)


class DraftModel:
    def __init__(self, model):
        self.model = model
        self.cache = KVCache(model.config.n_layer)
        self.cached = []
        self.forwards = 0

    @torch.no_grad()
    def propose(self, context, k, sampling=GREEDY, generator=None):
        feed = list(context[len(self.cached):]) or list(context[-1:])  # the bug: no rollback of rejected tokens
        tokens, probs = [], []
        for _ in range(k):
            logits = _reference.extend(self.model, self.cache, feed)[-1:]
            self.cached += feed
            self.forwards += 1
            q = _reference.probabilities(logits, sampling, [list(context) + tokens])[0]
            token = q.argmax().item() if sampling.greedy else torch.multinomial(q, 1, generator=generator).item()
            tokens.append(token)
            probs.append(q)
            feed = [token]
        return tokens, torch.stack(probs) if probs else torch.empty(0)


_reference.DraftModel = DraftModel
globals().update(public_names(_reference))
