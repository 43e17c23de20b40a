"""ChoiceConstraint.advance takes a special token (EOS, whose bytes are None) as no bytes at all: advancing with
EOS, a caller's bug, quietly keeps the state instead of raising ValueError."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_6e_advance_refuses_eos_and_forbidden_tokens"  # the check that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def advance(self, state, token_id):
        token = self.vocab.tokens[token_id] or b""  # the bug: a special token counts as no text
        if state + token not in self.prefixes:
            raise ValueError(f"token {token_id} ({token!r}) is not allowed after {state!r}: pick tokens from allowed(state).")
        return state + token


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
