"""sample() on a batch of greedy rows without a penalty (the one-argmax shortcut) returns a list of 0-d tensors
instead of Python ints: list(logits.argmax(dim=1)). They compare equal to ints with ==, but a caller that
json-dumps them, uses them as dict keys or appends them to a token list gets tensors."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex6_decoding"
PART = "test_differential_6b_sampler"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "sample", "return logits.argmax(dim=1).tolist()",
                                                  "return list(logits.argmax(dim=1))")))
