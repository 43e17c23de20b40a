"""KV-cache generate that takes the pad id (<|endoftext|>, 50256) in the prompt for padding and hides it
from attention with an attention mask."""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache, attention_forward, block_forward, causal_mask, forward  # noqa: F401

EXERCISE = "ex2_kv_cache"
PAD_TOKEN_ID = EOS_TOKEN_ID  # GPT-2 has no pad token: the EOS id serves as one


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    visible = input_ids != PAD_TOKEN_ID  # the bug: a pad id inside real text is text, not padding
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = forward(model, input_ids, position_ids, kv_cache, attention_mask=visible)
        new_tokens.append(int(logits[0, -1].argmax()))
        if new_tokens[-1] == eos_token_id:
            break
        input_ids = torch.tensor([[new_tokens[-1]]], device=model.device)
        position_ids = position_ids[:, -1:] + 1
        visible = torch.cat([visible, torch.ones_like(input_ids, dtype=torch.bool)], dim=1)
    return new_tokens
