"""left_pad that builds its token and position ids as int32 ("token ids fit in 32 bits: half the memory"): the
model's embeddings accept them, so generation works, but the batch's ids are not the int64 (torch.long) every
other tensor of token ids in the workshop is, and code that mixes or indexes with them (torch.cat with a long
column, a scatter, a comparison by dtype) breaks or converts."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_differential_left_pad"  # the check that catches it: the control runner runs only that


def left_pad(prompts, pad_token_id=50256, device=None):
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.int32, device=device)  # the bug: int32
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.int32, device=device)
        attention_mask[row, width - len(prompt):] = True
    position_ids = (attention_mask.cumsum(dim=1, dtype=torch.int32) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


globals().update(public_names(reference_with(EXERCISE, left_pad=left_pad)))
