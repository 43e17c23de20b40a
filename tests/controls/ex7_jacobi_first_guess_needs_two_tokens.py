"""Jacobi decoding whose first guesses repeat the text's second-to-last token: any start is allowed and the
iteration repairs it, but a one-token prompt has no second-to-last token and raises IndexError. (A surviving
mutant of the reference: the checker's prompts were 1 to 40 tokens at random, rarely a single one.)"""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "7f_jacobi_is_greedy"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "jacobi_generate", "guesses = [tokens[-1]] * n",
                                                  "guesses = [tokens[-2]] * n")))  # the bug: no tokens[-2] in a one-token prompt
