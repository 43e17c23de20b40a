"""A choice mask that forgets multi-token continuations: it allows only a token that finishes a choice in
one go (fine for " yes"/" no", stuck on any choice that needs several tokens)."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6e_masks_on_a_toy"  # the checker's part that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def allowed(self, state):
        if state not in self.masks:
            ids = {self.vocab.index.get(c[len(state):]) for c in self.choices if c.startswith(state)} - {None}  # the bug
            if state in self.choices:
                ids.add(self.vocab.eos_token_id)
            self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
