"""ChoiceConstraint refuses an empty list and an empty choice but takes anything else as choices: numbers and
bytes are turned into their str(), a dict into its keys, instead of a ValueError that says choices are strings."""

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_6e_bad_choices_are_refused"  # the check that catches it


class ChoiceConstraint(reference.ChoiceConstraint):
    def __init__(self, choices, vocab):
        if isinstance(choices, str):
            raise TypeError(f"choices must be a list of strings, got {choices!r}: wrap a single answer in a list.")
        choices = [str(c) for c in choices]  # the bug: whatever they are, made strings
        super().__init__(choices, vocab)


globals().update(public_names(reference_with(EXERCISE, ChoiceConstraint=ChoiceConstraint)))
