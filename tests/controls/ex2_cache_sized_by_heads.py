"""KV-cache generate that sizes its cache by the model's head count instead of its layer count
(KVCache(model.config.n_head)): the tiny model has 4 of each, so nothing shows there; a model with more layers
than heads has no slot for its last layers' keys and values."""

import torch

from gpt import EOS_TOKEN_ID, check_request
from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
PART = "test_differential_generate"  # the check that catches it: the control runner runs only that

_module = reference_with(EXERCISE)
globals().update({name: value for name, value in public_names(_module).items() if name not in ("generate", "torch")})


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    kv_cache = _module.KVCache(model.config.n_head)  # the bug: n_head, not n_layer
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    for _ in range(max_new_tokens):
        next_token = _module.forward(model, input_ids, position_ids, kv_cache)[0, -1].argmax()
        new_tokens.append(next_token.item())
        if new_tokens[-1] == eos_token_id:
            break
        input_ids = next_token.view(1, 1)
        position_ids = position_ids[:, -1:] + 1
    return new_tokens
