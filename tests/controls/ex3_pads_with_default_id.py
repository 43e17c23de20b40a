"""left_pad ignores the pad_token_id it is given and always pads with GPT-2's EOS (the default): right
for the default, wrong for any caller that asks for another pad id."""

import solutions.ex3_static_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad_pads_with_the_given_id"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=reference.PAD_TOKEN_ID, device=None):
    return reference.left_pad(prompts, reference.PAD_TOKEN_ID, device)  # the bug: pad_token_id is never read


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
