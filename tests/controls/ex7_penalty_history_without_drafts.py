"""The target's verified positions are all scored with the accepted text as their repetition history,
without the drafted tokens before each position: a token the draft proposed earlier in the round is
not penalised where plain decoding would penalise it, so greedy output with a repetition penalty
differs from the target's own (and sampled output from its distribution)."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "history_includes_the_drafted"  # the checker's check that catches it

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
            histories = [self.tokens] * (len(drafted) + 1)  # the bug: row i's history leaves out drafted[:i]
            target_probs = _reference.probabilities(logits, self.sampling, histories)
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
