"""ChoiceConstraint accepts only a list: a tuple of choices, which the contract allows ("a list (or tuple) of
strings"), is refused with a ValueError."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_differential_6e_choices"  # the check that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def __init__(self, choices, vocab):
        if not isinstance(choices, list):  # the bug: a tuple is refused too
            raise ValueError(f"choices must be a list of strings, got {type(choices).__name__}.")
        super().__init__(choices, vocab)


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
