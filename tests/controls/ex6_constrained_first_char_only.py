"""A regex mask that checks only a token's FIRST character against the DFA: " 12a" passes for [ 0-9]+."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6f_masks_on_a_toy"  # the checker's part that catches it


class RegexConstraint(reference.RegexConstraint):
    def allowed(self, state):
        dfa_state, pending = state
        if pending or state in self.masks:
            return super().allowed(state)
        ids = []
        for i, split in enumerate(self.vocab.texts):
            if split is not None:
                text, unfinished = split
                if (self.dfa.step(dfa_state, text[0]) is not None) if text else self.dfa.can_continue(dfa_state, unfinished):
                    ids.append(i)  # the bug: the rest of the token is never walked
        if dfa_state in self.dfa.accepting:
            ids.append(self.vocab.eos_token_id)
        self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
