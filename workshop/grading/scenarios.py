"""hypothesis strategies that reach the edges a contract names, shared by the differential checks.

    around(*sizes)          a length at or one either side of each size (0 and 1 included), or anywhere between
    token_ids(...)          token ids biased to GPT-2's <|endoftext|> and other rare ids
    prompts(...)            lists of token ids with lengths around the given edges
    small_config()          GPTConfig with layer, head and width counts that differ from each other and from tiny's
    small_model(config)     a seeded random model of that config (cached: one build per config, device and dtype)
    dtypes()                a model's dtype: float32 most often, float16 and bfloat16 each in about one scenario in four
    as_dtype(model, dtype)  a copy of a shared model (the `model` fixture) in another dtype (cached: do not change it)
    tied_logits(...)        logits rows with exact ties and extreme values
"""

import copy
import dataclasses
import functools

import torch
from hypothesis import strategies as st

import gpt


def around(*sizes, low=0, high=None):
    """A length biased to the edges: 0, 1, each size, one either side of each and of its doubles, else anything
    in [low, high] (high defaults to twice the largest size plus one)."""
    high = high if high is not None else 2 * max(sizes, default=1) + 1
    edges = sorted({x for s in sizes for x in (s - 1, s, s + 1, 2 * s - 1, 2 * s, 2 * s + 1)} | {0, 1, low, high})
    edges = [x for x in edges if low <= x <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def token_ids(vocab_size=gpt.GPTConfig.vocab_size, eos=gpt.EOS_TOKEN_ID):
    """A token id, often an edge one: <|endoftext|> (about one in four), 0, the last id, or ids just below them."""
    specials = sorted({i for i in (0, 1, eos - 1, eos, vocab_size - 2, vocab_size - 1) if 0 <= i < vocab_size})
    ordinary = st.integers(0, vocab_size - 1)
    return st.one_of(st.just(eos) if 0 <= eos < vocab_size else ordinary, st.sampled_from(specials), ordinary, ordinary)


def prompts(*edges, min_len=1, max_len=64, vocab_size=gpt.GPTConfig.vocab_size):
    """A list of token ids whose length is biased to `edges` (block sizes, chunk sizes, ...) within [min_len, max_len]."""
    return around(*edges, low=min_len, high=max_len).flatmap(
        lambda n: st.lists(token_ids(vocab_size), min_size=n, max_size=n))


@st.composite
def small_config(draw, max_layers=3, n_positions=(16, 24, 32, 64), vocab_size=gpt.GPTConfig.vocab_size):
    """A GPT-2 config with counts unlike tiny's and unlike each other: 1-3 layers, 1-4 heads of width 2-8, a
    short context (so a prompt can reach it). The vocabulary stays GPT-2's (the tokenizer and EOS id assume it)."""
    n_head = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([2, 4, 6, 8]))
    return gpt.GPTConfig(vocab_size=vocab_size, n_positions=draw(st.sampled_from(n_positions)), n_embd=n_head * head_dim,
                         n_layer=draw(st.integers(1, max_layers)), n_head=n_head)


@functools.lru_cache(maxsize=32)
def _small_model(fields, device, seed, dtype):
    torch.manual_seed(seed)
    model = gpt.new_model(gpt.GPTConfig(*fields))
    with torch.no_grad():  # GPT-2's init makes a near-uniform distribution; a wider one gives greedy decoding clear winners
        model.lm_head.weight.mul_(20)
    return model.to(device=device, dtype=dtype).eval()  # the same float32 draw, rounded: each dtype's model is that model


def small_model(config, device="cpu", seed=0, dtype=torch.float32):
    """A seeded random model of `config`, built once per (config, device, seed, dtype) and shared: do not change it."""
    return _small_model(dataclasses.astuple(config), str(device), seed, dtype)


# The dtypes a model is graded in. Four of seven bugs a review found in the engines were right in float32 and wrong in
# half precision (a step computed in float32 and never cast back, a buffer or padding made in the default dtype, a cache
# rebuilt without the model's dtype): each half type is drawn in about one scenario in four, float32 in the other half.
# On a CPU the half types run too (slower: keep their models small). A check compares them with
# differential.tolerance(dtype) and greedy tokens with harness.tie_epsilon(dtype).
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtypes():
    """A model's dtype: float32 in about half the scenarios, float16 and bfloat16 in about a quarter each."""
    return st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16])


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


_copies = {}


def as_dtype(model, dtype):
    """`model` itself in its own dtype, else a copy of it in `dtype`, made once per (model, dtype) and shared: do not
    change it. For the checks that draw a dtype but use the session's `model` fixture (tiny)."""
    if dtype == next(model.parameters()).dtype:
        return model
    key = (id(model), dtype)
    if key not in _copies:
        _copies[key] = (model, copy.deepcopy(model).to(dtype).eval())  # the original kept: its id stays its own
    return _copies[key][1]


@st.composite
def tied_logits(draw, rows=(1, 4), vocab=(2, 12)):
    """A [rows, vocab] float32 tensor of logits drawn from a few values, so that exact ties are common, with
    -inf and large values among them."""
    n_rows, n_vocab = draw(st.integers(*rows)), draw(st.integers(*vocab))
    values = st.sampled_from([-float("inf"), -30.0, -1.0, 0.0, 0.5, 1.0, 1.0, 2.0, 30.0])
    grid = draw(st.lists(st.lists(values, min_size=n_vocab, max_size=n_vocab), min_size=n_rows, max_size=n_rows))
    logits = torch.tensor(grid, dtype=torch.float32)
    finite = torch.isfinite(logits).any(dim=-1)
    logits[~finite, 0] = 0.0  # every row keeps one finite logit: a distribution exists
    return logits
