"""DraftModel.propose penalises every drafted row with the context alone as its repetition history, without the
tokens it drafted before that row: q is not the distribution the draft's tokens were drawn from under the
penalty the sampling asks for."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7a_sampled_draft_penalises_its_history"  # the check that catches it

module = reference_with(EXERCISE)


class DraftModel(module.DraftModel):
    @torch.no_grad()
    def propose(self, context, k, sampling=module.GREEDY, generator=None):
        module.rollback(self.cache, min(len(self.cache), len(context) - 1))
        feed, tokens, probs = list(context[len(self.cache):]), [], []
        for _ in range(k):
            logits = module.extend(self.model, self.cache, feed)[-1:]
            self.forwards += 1
            q = module.probabilities(logits, sampling, [list(context)])[0]  # the bug: the drafts so far left out
            token = q.argmax().item() if sampling.greedy else torch.multinomial(q, 1, generator=generator).item()
            probs.append(q)
            tokens.append(token)
            feed = [token]
        return tokens, torch.stack(probs) if probs else torch.empty(0, self.model.config.vocab_size)


module.DraftModel = DraftModel
globals().update(public_names(module))
