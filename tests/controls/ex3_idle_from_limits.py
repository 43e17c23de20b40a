"""Static batching whose BatchStats count the idle slot-steps as if every row ran to its max_new_tokens
(slot_steps - sum of the limits): right when no row ends at an EOS, too few idle slots when one does."""

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from tests.control_support import public_names, reference_with

EXERCISE = "ex3_static_batching"
PART = "test_each_row_stops_at_its_own_eos"  # the check that catches it: the control runner runs only that


def generate_batch(model, prompts, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    result = reference.generate_batch(model, prompts, max_new_tokens, eos_token_id)
    limits = reference._check_requests(model, prompts, max_new_tokens)
    result.stats.idle_slot_steps = result.stats.slot_steps - sum(limits)  # the bug: an EOS row's early end is forgotten
    return result


globals().update(public_names(reference_with(EXERCISE, generate_batch=generate_batch)))
