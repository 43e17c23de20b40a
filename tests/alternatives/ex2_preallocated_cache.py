"""A different CORRECT design for exercise 2, which its checker must accept: the KV cache preallocates
one buffer per layer and writes each step's keys and values into it in place (growing it by doubling
when full) instead of concatenating; causal_mask returns an all-True mask for a single query instead of
None; generate takes each decode position from len(kv_cache) instead of counting it itself.

    pytest exercises/test_ex2_kv_cache.py --impl solutions --replace ex2_kv_cache=tests.alternatives.ex2_preallocated_cache
"""

import torch

from gpt import EOS_TOKEN_ID, check_request
from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"


class KVCache:
    """Per layer, a keys buffer and a values buffer [B, n_head, capacity, head_dim]; the first len(self)
    positions of each are filled."""

    def __init__(self, n_layer):
        self.buffers = [None] * n_layer  # per layer: (keys, values), allocated on the first update
        self.lengths = [0] * n_layer

    def __len__(self):
        return self.lengths[0]

    def update(self, layer, k, v):
        start, end = self.lengths[layer], self.lengths[layer] + k.shape[2]
        if self.buffers[layer] is None or end > self.buffers[layer][0].shape[2]:
            capacity = max(64, 2 * end)  # doubling: O(1) copies per position on average
            grown = tuple(t.new_empty(t.shape[0], t.shape[1], capacity, t.shape[3]) for t in (k, v))
            if self.buffers[layer] is not None:
                for new, old in zip(grown, self.buffers[layer]):
                    new[:, :, :start] = old[:, :, :start]
            self.buffers[layer] = grown
        keys, values = self.buffers[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.lengths[layer] = end
        return keys[:, :, :end], values[:, :, :end]  # views of the filled part: no copy


def causal_mask(q_len, kv_len, device):
    query_positions = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # the last q_len positions
    return torch.arange(kv_len, device=device)[None, :] <= query_positions  # [q_len, kv_len]; all True for one query


_module = reference_with(EXERCISE, KVCache=KVCache, causal_mask=causal_mask)  # forward() calls these two
globals().update({name: value for name, value in public_names(_module).items() if name not in ("generate", "torch")})


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    new_tokens = []
    while True:
        first = len(kv_cache)  # the new tokens sit right after the cached ones
        positions = torch.arange(first, first + input_ids.shape[1], device=model.device)[None]
        logits = forward(model, input_ids, positions, kv_cache)  # noqa: F821 (from the reference's copy)
        new_tokens.append(int(logits[0, -1].argmax()))
        if new_tokens[-1] == eos_token_id or len(new_tokens) == max_new_tokens:
            return new_tokens
        input_ids = torch.tensor([[new_tokens[-1]]], device=model.device)
