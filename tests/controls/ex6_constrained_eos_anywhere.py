"""A regex mask that allows EOS in every state, accepting or not: generation may stop half-way through a match."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6f_masks_on_a_toy"  # the checker's part that catches it


class RegexConstraint(reference.RegexConstraint):
    def allowed(self, state):
        mask = super().allowed(state)
        mask[self.vocab.eos_token_id] = True  # the bug (in the cached tensor itself)
        return mask


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
