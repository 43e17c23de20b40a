"""ChoiceConstraint.allowed builds each new state's mask by testing every token of the vocabulary against the
choices' prefixes: the masks are right, but every state costs a loop over 50,257 tokens."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_6e_allowed_costs_the_choices_not_the_vocabulary"  # the check that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def allowed(self, state):
        if state not in self.masks:
            ids = {i for i, t in enumerate(self.vocab.tokens) if t is not None and state + t in self.prefixes}  # the bug
            if state in self.choices:
                ids.add(self.vocab.eos_token_id)
            self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
