"""Static batching that sorts the requests by prompt length (less padding per batch) and returns
the outputs in that sorted order instead of the order the requests came in."""

import solutions.ex3_static_batching as reference
from gpt import EOS_TOKEN_ID
from tests.control_support import public_names

EXERCISE = "ex3_static_batching"
PART = "test_each_row_equals_the_request_alone"  # the check that catches it: the control runner runs only that

globals().update(public_names(reference))


def generate(model, prompts, max_new_tokens, batch_size, eos_token_id=EOS_TOKEN_ID):
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    result = reference.generate(model, [prompts[i] for i in order], [limits[i] for i in order], batch_size, eos_token_id)
    return result  # the bug: result.outputs[k] belongs to request order[k], not to request k
