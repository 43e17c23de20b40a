"""Static batching that stops each row at its EOS (right tokens) but keeps the batch running until
the largest max_new_tokens, even when every row has already finished: forward passes for nothing."""

import torch

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_each_row_stops_at_its_own_eos"  # the check that catches it: the control runner runs only that


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, mask, positions = reference.left_pad(prompts, device=model.device)
    stats = reference.BatchStats(prompt_tokens=sum(map(len, prompts)), padding_tokens=input_ids.numel() - sum(map(len, prompts)))
    outputs, finished, cache = [[] for _ in prompts], [False] * len(prompts), KVCache(model.config.n_layer)
    for step in range(max(limits)):  # the bug: the number of steps is fixed before EOS can end them
        next_tokens = forward(model, input_ids, positions, cache, mask)[:, -1].argmax(-1)
        stats.forward_passes += 1
        for row, token in enumerate(next_tokens.tolist()):
            if finished[row]:
                stats.idle_slot_steps += 1
                continue
            outputs[row].append(token)
            finished[row] = token == eos_token_id or len(outputs[row]) == limits[row]
        advance = torch.tensor([[not done] for done in finished], device=model.device)
        input_ids, positions = next_tokens[:, None], positions[:, -1:] + advance
        mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
    stats.slot_steps = len(prompts) * stats.forward_passes
    stats.generated_tokens = sum(map(len, outputs))
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
