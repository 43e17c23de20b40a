"""generate() never calls check_request: max_new_tokens=0 returns no token instead of an error, and an empty
or too long prompt reaches the model (and its all-reduces) before anything refuses it."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_9c_generate_checks_the_request_first"  # the check that catches it

module = reference_with(EXERCISE)
module.check_request = lambda prompt_ids, max_new_tokens, n_positions, vocab_size=None: None  # the bug: no check
globals().update(public_names(module))
