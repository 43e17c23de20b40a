"""Exercise 2: the KV cache.

In naive generation, step t recomputes the keys and values of every earlier position although they
never change (a position only attends to itself and earlier ones). A KV cache keeps them: one
*prefill* pass runs the prompt and stores every layer's keys and values, then each *decode* step runs
only the newest token, appends its key and value, and attends over everything cached.

The functions below mirror gpt.py's classes, with a kv_cache threaded through them:
forward (GPTLMHead + GPTModel) -> block_forward (GPTBlock) -> attention_forward (GPTAttention).
They reuse the modules' own weights, so any gpt.py model works unchanged.

Stuck? exercises/hints/ex2.md has hints for each TODO, from the idea to near-code: open one at a time.
Check your work with:  pytest exercises/test_ex2_kv_cache.py
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
        # TODO (exercise 2): the contract:
        #   - returns (keys, values) of EVERY position cached for `layer` so far, oldest first, the
        #     new ones last: [B, n_head, T_cached + T_new, head_dim]. Nothing is ever dropped: a
        #     sequence may grow to the model's whole context (n_positions).
        #   - each layer has its own keys and values; updating one layer leaves the others alone.
        #   - len(self) counts the positions cached (forward reads it before layer 0's update).
        # Another layout inside (e.g. a buffer written in place) is fine if the above holds; then make
        # __len__ agree with it.
        raise NotImplementedError("Exercise 2: implement KVCache.update() in exercises/ex2_kv_cache.py: store this step's "
                                  "keys/values after the ones the layer holds, return all of them.")


def causal_mask(q_len, kv_len, device):
    """Boolean [q_len, kv_len] mask, True where a query may attend; None when nothing needs masking.

    The q_len queries are the LAST q_len of the kv_len positions, so query i sits at position
    kv_len - q_len + i and may see keys 0 .. kv_len - q_len + i (a lower-right aligned triangle).
    A single decoding query sees every cached key: no mask at all.
    """
    # TODO (exercise 2): the contract is the docstring: a bool tensor [q_len, kv_len] on `device`, or
    # None (or all True) for a single query. The trap: SDPA's is_causal=True aligns its triangle to
    # the upper LEFT, as if the queries were the FIRST q_len positions; that is only right when
    # q_len == kv_len (the prefill), and wrong for a chunk fed after cached positions.
    raise NotImplementedError("Exercise 2: implement causal_mask() in exercises/ex2_kv_cache.py: which cached "
                              "positions each of the last q_len queries may see.")


def attention_forward(attn, x, kv_cache, layer, mask):
    """GPTAttention.forward with a KV cache. x: [B, T_new, C]; mask: None or bool, broadcastable to
    [B, n_head, T_new, T_cached + T_new]."""
    B, T, C = x.shape
    # TODO (exercise 2): the contract: returns [B, T_new, C], the same numbers GPTAttention.forward
    # (gpt.py) would give for these T_new positions if it ran the whole sequence, up to float rounding.
    # The new tokens' queries attend over the keys/values of every position so far (the cached ones,
    # then their own, which must end up in kv_cache for the next steps); `mask` says which they may see.
    raise NotImplementedError("Exercise 2: implement attention_forward() in exercises/ex2_kv_cache.py: attention of "
                              "the new queries over the cached keys/values plus the new ones.")


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
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    kv_cache = KVCache(model.config.n_layer)
    # TODO (exercise 2): the contract:
    #   - the same tokens as exercise 1's generate (greedy, new tokens only, list of Python ints), for
    #     any prompt up to the model's context, long ones included.
    #   - the cost: the prompt goes through the model once (the prefill), then every further forward
    #     pass runs exactly ONE token through `forward` with kv_cache. One forward pass per returned
    #     token, and none after the model's EOS (the checker counts them).
    #   - every token sits at its true position in the sequence, however long it grows.
    #   - an eos_token_id inside the prompt is an ordinary token: it neither stops nor is hidden.
    raise NotImplementedError("Exercise 2: implement generate() in exercises/ex2_kv_cache.py: prefill the prompt once, "
                              "then decode one token per forward pass through the cache, stopping right after EOS.")
