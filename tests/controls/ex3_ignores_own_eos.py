"""Static batching in which a row does not stop at its own EOS: it only stops at max_new_tokens."""

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_each_row_stops_at_its_own_eos"  # the check that catches it: the control runner runs only that


def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    return reference.generate_batch(model, prompts, max_new_tokens, eos_token_id=-1)  # the bug: EOS never ends a row


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
