"""Checker for exercise 2, the KV cache: pytest exercises/test_ex2_kv_cache.py"""

import random

import pytest
import torch

import solutions.ex1_generate as naive
import solutions.ex2_kv_cache as reference
from workshop.harness import (assert_generates_like, assert_stops_right_after_eos, count_model_work, implementation,
                               paired_timing, transformers_greedy)
from workshop.workloads import sample_prompts
from gpt import EOS_TOKEN_ID

HINT = ("Hint: the prefill runs the prompt at positions 0..T-1; each decode step runs ONE token at the next position "
        "(T, T+1, ...) and attends over every cached key and value.")


@pytest.fixture(scope="module")
def student():
    return implementation("ex2_kv_cache")


@pytest.fixture(scope="module")
def cases(model, seed):
    rng = random.Random(seed + 2)
    return [(prompt, rng.randint(2, 32)) for prompt in sample_prompts(model, 4, 1, 40, seed + 2)]


def test_cache_update_appends(student, seed):
    """KVCache.update appends along the time axis and returns everything cached for that layer."""
    g = torch.Generator().manual_seed(seed)
    cache = student.KVCache(n_layer=2)
    chunks = [torch.randn(2, 4, t, 8, generator=g) for t in (3, 1, 2)]
    for i, k in enumerate(chunks):
        keys, values = cache.update(1, k, -k)
        expected = torch.cat(chunks[: i + 1], dim=2)
        assert keys.shape == expected.shape, f"after {i + 1} updates, keys have shape {tuple(keys.shape)}, expected {tuple(expected.shape)} (append along dim 2)."
        assert torch.equal(keys, expected) and torch.equal(values, -expected), "update must return the old keys/values followed by the new ones."
    assert cache.keys[0] is None, "update(layer=1, ...) must not touch layer 0."


@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (1, 9), (5, 5), (3, 8), (4, 12)])
def test_causal_mask(student, q_len, kv_len):
    mask = student.causal_mask(q_len, kv_len, "cpu")
    if q_len == 1:
        assert mask is None or bool(mask.all()), "a single new query may attend to every cached key: return None."
        return
    query_positions = torch.arange(kv_len - q_len, kv_len)[:, None]  # the new tokens are the last q_len
    expected = torch.arange(kv_len)[None, :] <= query_positions
    assert mask is not None and mask.shape == (q_len, kv_len), f"causal_mask({q_len}, {kv_len}) should be a [{q_len}, {kv_len}] boolean tensor, got {None if mask is None else tuple(mask.shape)}."
    assert torch.equal(mask.bool(), expected), (f"causal_mask({q_len}, {kv_len}) is wrong: query i sits at position {kv_len - q_len}+i "
                                                f"and sees keys up to that position.\nexpected\n{expected.int()}\ngot\n{mask.int()}")


def test_chunked_forward_equals_full_forward(student, model, seed):
    """Feeding a sequence in chunks through the cache (prefill, then several tokens at once, then one)
    gives the same logits as gpt.py on the whole sequence: the case q_len != kv_len."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (2, 23), generator=g).to(model.device)
    positions = torch.arange(23, device=model.device).expand(2, -1)
    with torch.no_grad():
        full = model(ids, positions)
        cache = student.KVCache(model.config.n_layer)
        for start, end in [(0, 9), (9, 16), (16, 17), (17, 23)]:
            logits = student.forward(model, ids[:, start:end], positions[:, start:end], cache)
            assert logits.shape == (2, end - start, model.config.vocab_size), f"forward on {end - start} new tokens returned shape {tuple(logits.shape)}."
            error = (logits - full[:, start:end]).abs().max().item()
            assert error < 1e-4, (f"logits of positions {start}..{end - 1}, fed after {start} cached ones, differ from the full "
                                  f"forward by {error:.2e}. Check the mask when q_len != kv_len (is_causal=True is upper-left aligned).")


def test_matches_naive_generate(student, model, tokenizer, cases):
    assert_generates_like(student.generate, lambda prompt, n: naive.generate(model, prompt, n), model, tokenizer, cases,
                          "naive generation (exercise 1)", HINT)


def test_matches_transformers(student, model, hf_model, tokenizer, cases):
    assert_generates_like(student.generate, lambda prompt, n: transformers_greedy(hf_model, prompt, n, EOS_TOKEN_ID), model,
                          tokenizer, cases, "transformers' greedy generate", HINT)


def test_stops_right_after_eos(student, model, tokenizer, cases, seed):
    assert_stops_right_after_eos(student.generate, reference.generate, model, tokenizer, [p for p, _ in cases], seed)


def test_cost_is_linear(student, model, cases):
    """Prefill pushes the prompt once; every later step pushes exactly one token."""
    for prompt, n in cases:
        with count_model_work(model) as work:
            got = student.generate(model, prompt, n, eos_token_id=-1)
        assert len(got) == n, f"asked for {n} new tokens (no EOS can occur), got {len(got)}."
        expected = len(prompt) + n - 1
        assert (work.forward_passes, work.tokens) == (n, expected), (
            f"for a {len(prompt)}-token prompt and {n} new tokens expected {n} forward passes pushing {expected} tokens "
            f"(prompt once, then one token per step), counted {work.forward_passes} passes and {work.tokens} tokens.")


@pytest.mark.timing
def test_speed_against_reference(student, model, device, cases):
    prompt = cases[0][0]
    assert student.generate(model, prompt, 32) == reference.generate(model, prompt, 32), "correctness first: see the other checks"
    timing = paired_timing(lambda: student.generate(model, prompt, 32), lambda: reference.generate(model, prompt, 32), device=device)
    limit = 2.0 if device == "cpu" else 1.5
    assert timing.ratio < limit, (f"your KV-cache generate takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n"
                                  f"{timing.report('yours', 'reference')}")


@pytest.mark.timing
def test_speedup_over_naive_grows_with_length(student, model, device, cases):
    prompt = min((p for p, _ in cases), key=len)  # short, so that the naive runs stay quick
    speedups = {}
    for n in (8, 64):
        timing = paired_timing(lambda: naive.generate(model, prompt, n), lambda: student.generate(model, prompt, n),
                               repeats=3, device=device)
        speedups[n] = timing.ratio
    report = ", ".join(f"{s:.1f}x at {n} tokens" for n, s in speedups.items())
    assert speedups[64] > 1.5, f"the KV cache should be clearly faster than naive at 64 new tokens: {report}."
    assert speedups[64] > speedups[8], f"the KV cache's advantage should grow with length: {report}."
