"""'Static' batching that drops finished rows from the batch: right tokens, but the counters show it
is not the padded static batch the exercise asks for (no idle slots, fewer tokens pushed)."""

import torch

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_cost_counters"  # the check that catches it


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, mask, positions = reference.left_pad(prompts, device=model.device)
    stats = reference.BatchStats(prompt_tokens=sum(map(len, prompts)), padding_tokens=input_ids.numel() - sum(map(len, prompts)))
    outputs, rows, cache = [[] for _ in prompts], list(range(len(prompts))), KVCache(model.config.n_layer)
    while rows:
        next_tokens = forward(model, input_ids, positions, cache, mask)[:, -1].argmax(-1)
        stats.forward_passes += 1
        stats.slot_steps += len(rows)
        keep = []
        for i, (row, token) in enumerate(zip(rows, next_tokens.tolist())):
            outputs[row].append(token)
            if token != eos_token_id and len(outputs[row]) < limits[row]:
                keep.append(i)
        index = torch.tensor(keep, dtype=torch.long, device=model.device)  # the bug: finished rows leave
        cache.keys = [k[index] for k in cache.keys]
        cache.values = [v[index] for v in cache.values]
        rows, input_ids = [rows[i] for i in keep], next_tokens[index][:, None]
        positions, mask = positions[index, -1:] + 1, torch.cat([mask[index], mask.new_ones(len(keep), 1)], dim=1)
    stats.generated_tokens = sum(map(len, outputs))
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
