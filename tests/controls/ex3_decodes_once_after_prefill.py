"""Static batching written as "prefill, then decode until every row is done", with the test for "done" only at the
end of a decode step: when every row finishes at the prefill (every max_new_tokens is 1, or every row's first token
is its EOS), it still runs one decode step, and counts it, for nothing."""

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
    outputs, finished, cache = [[] for _ in prompts], [False] * B, KVCache(model.config.n_layer)

    def step(input_ids, position_ids):
        next_tokens = forward(model, input_ids, position_ids, cache, attention_mask)[:, -1].argmax(dim=-1)
        stats.forward_passes += 1
        for row, token in enumerate(next_tokens.tolist()):
            if finished[row]:
                stats.idle_slot_steps += 1
                continue
            outputs[row].append(token)
            finished[row] = token == eos_token_id or len(outputs[row]) == limits[row]
        return next_tokens

    next_tokens = step(input_ids, position_ids)  # the prefill
    while True:  # the bug: no test for "every row is done" between the prefill and the first decode step
        advance = torch.tensor([[not done] for done in finished], dtype=torch.long, device=model.device)
        position_ids = position_ids[:, -1:] + advance
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
        next_tokens = step(next_tokens[:, None], position_ids)
        if all(finished):
            break
    stats.slot_steps = B * stats.forward_passes
    stats.generated_tokens = sum(map(len, outputs))
    return reference.BatchResult(outputs, stats)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
