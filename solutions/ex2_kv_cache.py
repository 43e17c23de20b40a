"""Exercise 2: the KV cache.

In naive generation, step t recomputes the keys and values of every earlier position although they
never change (a position only attends to itself and earlier ones). A KV cache keeps them: one
*prefill* pass runs the prompt and stores every layer's keys and values, then each *decode* step runs
only the newest token, appends its key and value, and attends over everything cached.

The functions below mirror gpt.py's classes, with a kv_cache threaded through them:
forward (GPTLMHead + GPTModel) -> block_forward (GPTBlock) -> attention_forward (GPTAttention).
They reuse the modules' own weights, so any gpt.py model works unchanged.
"""

import torch
import torch.nn.functional as F

from gpt import EOS_TOKEN_ID, check_model_inputs, check_request


class KVCache:
    """Every layer's keys and values so far, each [B, n_head, T, head_dim]."""

    def __init__(self, n_layer):
        self.keys = [None] * n_layer
        self.values = [None] * n_layer

    def __len__(self):
        """Number of positions cached."""
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(self, layer, k, v):
        """Append this step's k, v ([B, n_head, T_new, head_dim]) for `layer`; return all keys and values."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def causal_mask(q_len, kv_len, device):
    """Boolean [q_len, kv_len] mask, True where a query may attend; None when nothing needs masking.

    The q_len queries are the LAST q_len of the kv_len positions, so query i sits at position
    kv_len - q_len + i and may see keys 0 .. kv_len - q_len + i (a lower-right aligned triangle).
    A single decoding query sees every cached key: no mask at all.
    """
    if q_len == 1:
        return None
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


def attention_forward(attn, x, kv_cache, layer, mask):
    """GPTAttention.forward with a KV cache. x: [B, T_new, C]; mask: None or bool, broadcastable to
    [B, n_head, T_new, T_cached + T_new]."""
    B, T, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
    k, v = kv_cache.update(layer, k, v)  # now the keys/values of every position so far
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def block_forward(block, x, kv_cache, layer, mask):
    """GPTBlock.forward with a KV cache."""
    x = x + attention_forward(block.attn, block.ln_1(x), kv_cache, layer, mask)
    return x + block.mlp(block.ln_2(x))


def forward(model, input_ids, position_ids, kv_cache, attention_mask=None):
    """GPTLMHead.forward with a KV cache: runs only the NEW tokens input_ids [B, T_new] at position_ids
    [B, T_new], appends their keys and values to kv_cache, returns logits [B, T_new, vocab].

    attention_mask (used from exercise 3 on): bool [B, T_cached + T_new], False for padding keys
    that no query may attend to.
    """
    check_model_inputs(model.config, input_ids, position_ids)  # ids and positions in range, on the host (CPU tensors)
    T = input_ids.shape[1]
    mask = causal_mask(T, len(kv_cache) + T, input_ids.device)
    if attention_mask is not None:  # hide padding keys from every query of that row
        padding = attention_mask[:, None, None, :]  # [B, 1, 1, kv_len]: broadcast over heads and queries
        mask = padding if mask is None else mask & padding
        if T > 1:  # a pad query would see no key at all (NaN in some GPU kernels): let every query see itself
            kv_len = len(kv_cache) + T
            itself = torch.arange(kv_len - T, kv_len, device=input_ids.device)[:, None] == torch.arange(kv_len, device=input_ids.device)
            mask = mask | itself
    transformer = model.transformer
    x = transformer.wte(input_ids) + transformer.wpe(position_ids)
    for layer, block in enumerate(transformer.h):
        x = block_forward(block, x, kv_cache, layer, mask)
    return model.lm_head(transformer.ln_f(x))


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding with a KV cache: same output as exercise 1, O(n) token-passes instead of O(n^2).

    Prefill: the whole prompt in one forward. Decode: one token per forward, at the next position.
    """
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)  # [1, T]: the prefill runs the prompt
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = forward(model, input_ids, position_ids, kv_cache)
        next_token = logits[0, -1].max(dim=-1).indices  # the argmax: max(dim) finds it faster than argmax() on a CPU
        new_tokens.append(next_token.item())
        if new_tokens[-1] == eos_token_id:  # only the model's token stops, and before any further forward
            break
        input_ids = next_token.view(1, 1)  # decode: only the new token goes in...
        position_ids = position_ids[:, -1:] + 1  # ...at the position after the last one
    return new_tokens
