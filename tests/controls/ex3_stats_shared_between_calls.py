"""Static batching whose BatchStats is a default argument (stats=BatchStats(), "so that a caller may pass its own
to add to"): Python makes that default once, so every call without one adds to the same counters, and every
BatchResult holds that one object. The first batch is right; each later one reports the sum of all so far."""

import torch

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_differential_generate_batch"  # the check that catches it: the control runner runs only that


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID, stats=reference.BatchStats()):  # the bug
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, attention_mask, position_ids = reference.left_pad(prompts, device=model.device)
    B = len(prompts)
    stats.prompt_tokens += sum(map(len, prompts))
    stats.padding_tokens += input_ids.numel() - sum(map(len, prompts))
    outputs, finished, cache = [[] for _ in prompts], [False] * B, KVCache(model.config.n_layer)
    while True:
        next_tokens = forward(model, input_ids, position_ids, cache, attention_mask)[:, -1].argmax(dim=-1)
        stats.forward_passes += 1
        stats.slot_steps += B
        for row, token in enumerate(next_tokens.tolist()):
            if finished[row]:
                stats.idle_slot_steps += 1
                continue
            outputs[row].append(token)
            stats.generated_tokens += 1
            finished[row] = token == eos_token_id or len(outputs[row]) == limits[row]
        if all(finished):
            break
        input_ids = next_tokens[:, None]
        advance = torch.tensor([[not done] for done in finished], dtype=torch.long, device=model.device)
        position_ids = position_ids[:, -1:] + advance
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
