"""Static batching that tracks its rows in a tensor and adds the counts of live and finished rows to BatchStats as
they come (stats.generated_tokens += running.sum()): the counters become 0-dim tensors. They print and compare like
ints, so a caller comparing them sees nothing, until it formats them, sums them into JSON, or keeps them alive."""

import torch

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, forward
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_differential_generate_batch"  # the check that catches it: the control runner runs only that


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    input_ids, attention_mask, position_ids = reference.left_pad(prompts, device=model.device)
    B, n_real = len(prompts), sum(map(len, prompts))
    stats = reference.BatchStats(prompt_tokens=n_real, padding_tokens=input_ids.numel() - n_real)
    limits = torch.tensor(limits, device=model.device)
    counts = torch.zeros(B, dtype=torch.long, device=model.device)
    running = torch.ones(B, dtype=torch.bool, device=model.device)
    outputs, cache = [[] for _ in prompts], KVCache(model.config.n_layer)
    while True:
        next_tokens = forward(model, input_ids, position_ids, cache, attention_mask)[:, -1].argmax(dim=-1)
        stats.forward_passes += 1
        stats.generated_tokens += running.sum()  # the bug: a 0-dim tensor, not an int
        stats.idle_slot_steps += (~running).sum()
        for row in running.nonzero().flatten().tolist():
            outputs[row].append(int(next_tokens[row]))
        counts += running
        running &= (next_tokens != eos_token_id) & (counts < limits)
        if not running.any():
            break
        input_ids = next_tokens[:, None]
        position_ids = position_ids[:, -1:] + running[:, None]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
    stats.slot_steps = B * stats.forward_passes
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
