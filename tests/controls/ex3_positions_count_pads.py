"""Static batching whose position ids count the pads: a row padded by k sees its first token at
position k instead of 0 (GPT-2's positions are absolute, so its output changes)."""

import torch

import solutions.ex3_static_batching as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=50256, device=None):
    input_ids, attention_mask, _ = reference.left_pad(prompts, pad_token_id, device)
    width = input_ids.shape[1]
    position_ids = torch.arange(width, device=input_ids.device).expand(len(prompts), -1)  # the bug
    return input_ids, attention_mask, position_ids


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
