"""A draft that remembers which tokens its cache holds, in a list declared on the class (cached = []) and
changed in place: every DraftModel shares it. One decoder alone works; two decoders used in turn each read the
other's tokens, find no common prefix with their own context, and run their whole context through the draft
again every round (never the prompt again, says the contract)."""

import torch

from solutions.ex2_kv_cache import KVCache
from workshop.serving.sampling import GREEDY
from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "differential_decoder"  # the check that catches it

_reference = reference_with(EXERCISE)


class DraftModel:
    cached = []  # the bug: one list for every instance (meant: self.cached = [] in __init__)

    def __init__(self, model):
        self.model = model
        self.cache = KVCache(model.config.n_layer)
        self.forwards = 0

    @torch.no_grad()
    def propose(self, context, k, sampling=GREEDY, generator=None):
        keep = 0
        while keep < min(len(self.cached), len(self.cache), len(context) - 1) and self.cached[keep] == context[keep]:
            keep += 1
        _reference.rollback(self.cache, keep)
        feed, tokens, probs = list(context[keep:]), [], []
        for _ in range(k):
            logits = _reference.extend(self.model, self.cache, feed)[-1:]
            self.forwards += 1
            q = _reference.probabilities(logits, sampling, [list(context) + tokens])[0]
            token = q.argmax().item() if sampling.greedy else torch.multinomial(q, 1, generator=generator).item()
            tokens.append(token)
            probs.append(q)
            feed = [token]
        self.cached[:] = list(context) + tokens[:-1]  # what the cache holds now
        return tokens, torch.stack(probs) if probs else torch.empty(0, self.model.config.vocab_size)


_reference.DraftModel = DraftModel
globals().update(public_names(_reference))
