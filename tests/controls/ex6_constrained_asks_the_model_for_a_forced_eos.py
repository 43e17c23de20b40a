"""generate runs the model even when the mask allows nothing but EOS: the same tokens, one forward too many
at the end of every choice (the contract: append it without running the model)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex6_constrained"
PART = "test_6e_generate_greedy_gives_a_choice"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "generate", "allowed.sum() == 1", "allowed.sum() == 0")))
