"""Jacobi iteration halves what is left for its window (room >> 1) instead of keeping it n wide wherever
max_new_tokens leaves room: the tokens are still greedy and never past max_new_tokens, but near the end each
forward verifies fewer guesses than it may, and runs more forwards (a surviving mutant of the reference)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "test_7f_jacobi_is_greedy_and_counts_its_forwards"

globals().update(public_names(reference_with_edit(EXERCISE, "jacobi_generate", "max_new_tokens - len(new_tokens) - 1)",
                                                  "max_new_tokens - len(new_tokens) >> 1)")))
