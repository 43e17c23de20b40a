"""left_pad ignores its `device` and leaves its tensors on the default device: right on a CPU, but on a
GPU they meet the model's weights there and the first forward raises."""

import solutions.ex3_static_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad_is_made_on_the_given_device"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=reference.PAD_TOKEN_ID, device=None):
    return reference.left_pad(prompts, pad_token_id)  # the bug: device is never passed on


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
