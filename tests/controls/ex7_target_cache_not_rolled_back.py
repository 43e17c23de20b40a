"""After verification the target's cache is not rolled back: the keys and values of rejected draft
tokens stay in it, and every later round attends to them."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "7e"  # the checker's part that catches it

_reference = reference_with(EXERCISE)


class SpeculativeDecoder(_reference.SpeculativeDecoder):
    @torch.no_grad()
    def step(self, max_tokens):
        k = min(self.k, max_tokens - 1)
        drafted, draft_probs = self.draft.propose(self.tokens, k, self.sampling, self.generator) if k else ([], None)
        logits = _reference.verify(self.target, self.cache, self.tokens, drafted)
        if self.sampling.greedy and self.sampling.repetition_penalty == 1:
            emitted = _reference.accept_greedy(drafted, logits)
        else:
            target_probs = _reference.probabilities(logits, self.sampling, [self.tokens + drafted[:i] for i in range(len(drafted) + 1)])
            emitted = _reference.accept_sampled(drafted, draft_probs, target_probs, self.generator)
        # the bug: no rollback(self.cache, ...) here
        accepted = len(emitted) - 1
        if self.eos_token_id in emitted:
            emitted = emitted[: emitted.index(self.eos_token_id) + 1]
            self.finished = True
        self.tokens += emitted
        self.stats.target_forwards += 1
        self.stats.draft_forwards = self.draft.forwards
        self.stats.drafted += len(drafted)
        self.stats.accepted += accepted
        self.stats.generated += len(emitted)
        return emitted


_reference.SpeculativeDecoder = SpeculativeDecoder
globals().update(public_names(_reference))
