"""A regex mask that never allows a token ending inside a UTF-8 character (b"\\xc3", the first byte of "é"):
a sensible-looking simplification that forbids what outlines-core allows, and some spellings of a match."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6f_masks_on_a_toy"  # the checker's part that catches it


class RegexConstraint(reference.RegexConstraint):
    def allowed(self, state):
        if state not in self.masks:
            mask = super().allowed(state).clone()
            for i, split in enumerate(self.vocab.texts):
                if split is not None and split[1]:
                    mask[i] = False  # the bug
            self.masks[state] = mask
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
