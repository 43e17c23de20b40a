"""Greedy verification compares the drafts with the argmax of the target's raw logits even when a
repetition penalty is set: the output is the target's plain greedy text, not its greedy decoding with
the penalty that was asked for."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "repetition_penalty_is_the_targets_own"  # the checker's check that catches it

_reference = reference_with(EXERCISE)


class SpeculativeDecoder(_reference.SpeculativeDecoder):
    @torch.no_grad()
    def step(self, max_tokens):
        k = min(self.k, max_tokens - 1)
        drafted, draft_probs = self.draft.propose(self.tokens, k, self.sampling, self.generator) if k else ([], None)
        logits = _reference.verify(self.target, self.cache, self.tokens, drafted)
        if self.sampling.greedy:  # the bug: the repetition penalty is not looked at
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
        self.stats.drafted += len(drafted)
        self.stats.accepted += accepted
        self.stats.generated += len(emitted)
        return emitted


_reference.SpeculativeDecoder = SpeculativeDecoder
globals().update(public_names(_reference))
