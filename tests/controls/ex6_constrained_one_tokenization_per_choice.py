"""A choice mask built as a trie of ONE tokenization per choice (longest tokens first): it forbids every
other way of spelling a choice (" y" + "es" for " yes"), which the stated rule allows."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6e_masks_on_a_toy"  # the checker's part that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def __init__(self, choices, vocab):
        super().__init__(choices, vocab)
        self.spelled = set()  # every prefix of a choice along its one tokenization
        for choice in self.choices:
            start = 0
            while start < len(choice):
                end = max(e for e in range(start + 1, len(choice) + 1) if choice[start:e] in vocab.index)
                self.spelled.add((choice[:start], vocab.index[choice[start:end]]))
                start = end

    def allowed(self, state):
        if state not in self.masks:
            ids = {token for prefix, token in self.spelled if prefix == state}  # the bug: one spelling only
            if state in self.choices:
                ids.add(self.vocab.eos_token_id)
            self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
