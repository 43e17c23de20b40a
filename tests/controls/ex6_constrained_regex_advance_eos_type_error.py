"""RegexConstraint.advance with a special token (EOS, whose bytes are None) fails on `pending + None` with a
TypeError instead of the ValueError the contract gives a token that allowed() forbids."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_differential_6f_regex"  # the check that catches it


class RegexConstraint(reference.RegexConstraint):
    def advance(self, state, token_id):
        new_state = self._walk(state, self.vocab.tokens[token_id])  # the bug: None bytes reach pending + data
        if new_state is None:
            raise ValueError(f"token {token_id} is not allowed in state {state}: pick tokens from allowed(state).")
        return new_state


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
