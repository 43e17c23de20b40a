"""Static batching that runs a batch of one request as plain KV-cache generation (no padding, no mask: "nothing to
batch"), and fills in the BatchStats it knows of: the forward passes, slots and tokens, but not the prompt tokens of
the prefill. The outputs are right; a batch of one reports 0 prompt tokens."""

import solutions.ex2_kv_cache as one_by_one
import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_differential_generate_batch"  # the check that catches it: the control runner runs only that


def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    limits = reference._check_requests(model, prompts, max_new_tokens)
    if len(prompts) == 1:  # nothing to batch
        tokens = one_by_one.generate(model, prompts[0], limits[0], eos_token_id)
        n = len(tokens)  # the bug: prompt_tokens left at 0
        return reference.BatchResult([tokens], reference.BatchStats(forward_passes=n, slot_steps=n, generated_tokens=n))
    return reference.generate_batch(model, prompts, limits, eos_token_id)


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
