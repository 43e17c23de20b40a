"""A regex mask cache keyed by the step (tokens generated so far) instead of the DFA state: the first path
to reach a step decides that step's mask for every later path."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "6f_masks_on_a_toy"  # the checker's part that catches it


class RegexConstraint(reference.RegexConstraint):
    def __init__(self, pattern, vocab):
        self.by_step = {}
        super().__init__(pattern, vocab)

    def start(self):
        return (*super().start(), 0)  # (DFA state, pending bytes, step)

    def advance(self, state, token_id):
        return (*super().advance(state[:2], token_id), state[2] + 1)

    def allowed(self, state):
        if state[2] not in self.by_step:  # the bug: keyed by the step
            self.by_step[state[2]] = super().allowed(state[:2])
        return self.by_step[state[2]]


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
