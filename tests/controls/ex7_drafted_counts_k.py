"""stats.drafted adds k every round instead of the draft tokens really proposed: a last round that may
return only a few more tokens drafts fewer than k (and a draft may stop early, at its EOS), so drafted is
overcounted and the acceptance rate comes out too low."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "drafted_counts"  # the checker's check that catches it

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
        _reference.rollback(self.cache, len(self.tokens) + len(emitted) - 1)
        accepted = len(emitted) - 1
        if self.eos_token_id in emitted:
            emitted = emitted[: emitted.index(self.eos_token_id) + 1]
            self.finished = True
        self.tokens += emitted
        self.stats.target_forwards += 1
        self.stats.draft_forwards = self.draft.forwards
        self.stats.drafted += self.k  # the bug: k, not len(drafted)
        self.stats.accepted += accepted
        self.stats.generated += len(emitted)
        return emitted


_reference.SpeculativeDecoder = SpeculativeDecoder
globals().update(public_names(_reference))
