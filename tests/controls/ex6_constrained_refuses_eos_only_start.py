"""RegexConstraint.__init__ refuses a regex when no TEXT token can start it, leaving EOS out of the test: a regex
whose only match (in this vocabulary) is the empty string, such as "(xyz)?" over tokens without an x, is refused
although its start state allows EOS, a valid (empty) output."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_differential_6f_regex"  # the check that catches it


class RegexConstraint(reference.RegexConstraint):
    def __init__(self, pattern, vocab):
        self.vocab, self.pattern = vocab, pattern
        self.dfa = reference.CharDFA(pattern)
        self.masks = {}
        if self.dfa.initial is None:
            raise ValueError(f"the regex {pattern!r} matches nothing.")
        mask = self.allowed(self.start()).clone()
        mask[vocab.eos_token_id] = False  # the bug: EOS does not count as a way to start
        if not mask.any():
            raise ValueError(f"no token of the vocabulary can start a match of the regex {pattern!r}.")


globals().update(public_names(reference_with(EXERCISE, RegexConstraint=RegexConstraint)))
