"""SpeculativeDecoder.step always drafts k tokens, and cuts what it returns to max_tokens afterwards: the
output and the counters are right, but a last round drafts (and verifies) tokens that can never come back."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7e_never_drafts_what_could_not_be_returned"  # the check that catches it

module = reference_with(EXERCISE)


class SpeculativeDecoder(module.SpeculativeDecoder):
    @module.torch.no_grad()
    def step(self, max_tokens):
        drafted, draft_probs = self.draft.propose(self.tokens, self.k, self.sampling, self.generator)  # the bug: k, not max_tokens - 1
        logits = module.verify(self.target, self.cache, self.tokens, drafted)
        if self.sampling.greedy and self.sampling.repetition_penalty == 1:
            emitted = module.accept_greedy(drafted, logits)
        else:
            target_probs = module.probabilities(logits, self.sampling, [self.tokens + drafted[:i] for i in range(len(drafted) + 1)])
            emitted = module.accept_sampled(drafted, draft_probs, target_probs, self.generator)
        emitted = emitted[:max_tokens]  # ... and the tokens past max_tokens are thrown away
        module.rollback(self.cache, len(self.tokens) + len(emitted) - 1)
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


module.SpeculativeDecoder = SpeculativeDecoder
globals().update(public_names(module))
