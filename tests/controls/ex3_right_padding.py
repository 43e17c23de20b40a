"""Static batching with RIGHT padding: the pads follow the prompt, so a short row's "last" logits
are read at a pad position and its new tokens are appended after the pads."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_left_pad"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=50256, device=None):
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        input_ids[row, :len(prompt)] = torch.tensor(prompt)  # the bug: the prompt first, pads after it
        attention_mask[row, :len(prompt)] = True
    position_ids = torch.arange(width).expand(len(prompts), -1)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
