"""ChoiceConstraint keeps its mask cache on the vocabulary, to share the work between constraints: two
constraints with other choices over the same vocabulary then read each other's masks for equal states (the start
state b"" first of all)."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_differential_6e_choices"  # the check that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def __init__(self, choices, vocab):
        super().__init__(choices, vocab)
        if not hasattr(vocab, "_choice_masks"):
            vocab._choice_masks = {}
        self.masks = vocab._choice_masks  # the bug: one cache for every constraint of this vocabulary


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
