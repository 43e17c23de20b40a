"""Static batching that left-pads correctly but attends to the pads: the attention mask is all True."""

import solutions.ex3_static_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=50256, device=None):
    input_ids, attention_mask, position_ids = reference.left_pad(prompts, pad_token_id, device)
    return input_ids, attention_mask | True, position_ids  # the bug: every pad is visible


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
