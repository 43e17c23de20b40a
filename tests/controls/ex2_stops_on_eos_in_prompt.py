"""KV-cache generate that stops as soon as the sequence holds an EOS, so an <|endoftext|> in the prompt ends it."""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, causal_mask, forward  # noqa: F401

EXERCISE = "ex2_kv_cache"


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = forward(model, input_ids, position_ids, kv_cache)
        new_tokens.append(int(logits[0, -1].argmax()))
        if eos_token_id in list(prompt_ids) + new_tokens:  # the bug: looks at the prompt too
            break
        input_ids = torch.tensor([[new_tokens[-1]]], device=model.device)
        position_ids = position_ids[:, -1:] + 1
    return new_tokens
