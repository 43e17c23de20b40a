"""Static batching that ends a row as soon as its tokens hold EOS, looking at the prompt too: a
prompt with an end-of-text inside gets one token."""

import torch

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_each_row_equals_the_request_alone"  # the check that catches it: the control runner runs only that


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, mask, positions = reference.left_pad(prompts, device=model.device)
    stats = reference.BatchStats(prompt_tokens=sum(map(len, prompts)), padding_tokens=input_ids.numel() - sum(map(len, prompts)))
    outputs, finished, cache = [[] for _ in prompts], [False] * len(prompts), KVCache(model.config.n_layer)
    while True:
        next_tokens = forward(model, input_ids, positions, cache, mask)[:, -1].argmax(-1)
        stats.forward_passes += 1
        for row, token in enumerate(next_tokens.tolist()):
            if finished[row]:
                stats.idle_slot_steps += 1
                continue
            outputs[row].append(token)
            finished[row] = eos_token_id in prompts[row] + outputs[row] or len(outputs[row]) == limits[row]  # the bug
        if all(finished):
            break
        advance = torch.tensor([[not done] for done in finished], device=model.device)
        input_ids, positions = next_tokens[:, None], positions[:, -1:] + advance
        mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
    stats.slot_steps = len(prompts) * stats.forward_passes
    stats.generated_tokens = sum(map(len, outputs))
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
