"""generate stops one token early when the request fills the context exactly (len(prompt) + max_new_tokens ==
n_positions, which check_request allows): it caps the loop at n_positions - len(prompt) - 1 steps, afraid of a
position past the end, though the last token generated is never fed back."""

import torch

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_differential_9c"  # the check that catches it


@torch.no_grad()
def generate(tp_model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, tp_model.config.n_positions, tp_model.config.vocab_size)
    kv_cache = KVCache(tp_model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=tp_model.device)
    position_ids = torch.arange(len(prompt_ids), device=tp_model.device)[None]
    new_tokens = []
    for _ in range(min(max_new_tokens, tp_model.config.n_positions - len(prompt_ids) - 1)):  # the bug: - 1
        logits = tp_model(input_ids, position_ids, kv_cache)
        next_token = logits[0, -1].argmax()
        new_tokens.append(next_token.item())
        if new_tokens[-1] == eos_token_id:
            break
        input_ids = next_token.view(1, 1)
        position_ids = position_ids[:, -1:] + 1
    return new_tokens


globals().update(public_names(reference_with(EXERCISE, generate=generate)))
