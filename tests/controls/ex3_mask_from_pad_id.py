"""Static batching whose attention mask is `input_ids != pad_token_id`: it hides the pads, and also
every real token of a prompt that happens to be the pad id (GPT-2 pads with EOS, which real text holds)."""

import solutions.ex3_static_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=50256, device=None):
    input_ids, _, _ = reference.left_pad(prompts, pad_token_id, device)
    attention_mask = input_ids != pad_token_id  # the bug: a real 50256 in a prompt is taken for a pad
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
