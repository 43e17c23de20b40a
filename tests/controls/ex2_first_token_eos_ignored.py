"""KV-cache generate that tests for the EOS only in its decode loop: when the prefill's own token (the first
new one) is the EOS, generation goes on past it."""

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
    kv_cache = _module.KVCache(model.config.n_layer)
    positions = torch.arange(len(prompt_ids), device=model.device)[None]
    logits = _module.forward(model, torch.tensor([prompt_ids], device=model.device), positions, kv_cache)
    new_tokens = [int(logits[0, -1].argmax())]  # the prefill's token: the bug, never compared with the EOS
    while len(new_tokens) < max_new_tokens:
        position = len(prompt_ids) + len(new_tokens) - 1
        logits = _module.forward(model, torch.tensor([[new_tokens[-1]]], device=model.device),
                                 torch.tensor([[position]], device=model.device), kv_cache)
        new_tokens.append(int(logits[0, -1].argmax()))
        if new_tokens[-1] == eos_token_id:
            break
    return new_tokens
