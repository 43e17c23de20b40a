"""A regex mask that allows EOS whenever the DFA state accepts, even with the bytes of an unfinished UTF-8
character pending: the output may end in half a character (b"1\\xc3" for [0-9]{1,2}(é|ü)?)."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "no_eos_while"  # the checker's part that catches it


class RegexConstraint(reference.RegexConstraint):
    def allowed(self, state):
        if state not in self.masks:
            mask = super().allowed(state).clone()
            if state[0] in self.dfa.accepting:
                mask[self.vocab.eos_token_id] = True  # the bug: the pending bytes are not looked at
            self.masks[state] = mask
        return self.masks[state]


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
