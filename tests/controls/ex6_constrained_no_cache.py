"""A regex mask rebuilt on every call (no cache): correct masks, but each decode step walks all 50,257
tokens again, even in a state seen a moment ago."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "cached_masks_are_free"  # the checker's part that catches it
CAUGHT_BY_TIMING = True


class RegexConstraint(reference.RegexConstraint):
    def allowed(self, state):
        self.masks.clear()  # the bug
        return super().allowed(state)


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
