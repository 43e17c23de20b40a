"""Checker for exercise 1, naive greedy generation: pytest exercises/test_ex1_generate.py"""

import dataclasses
import random

import pytest
import torch
from hypothesis import strategies as st

import solutions.ex1_generate as reference
from workshop.grading.wording import plural
from workshop.grading.differential import GreedyTokens, Twins, explore
from workshop.grading.scenarios import around, dtype_name, dtypes, prompts, small_config, small_model, token_ids
from workshop.grading.harness import (assert_eos_in_prompt_is_text, assert_generates_like, assert_stops_right_after_eos,
                              compare_tokens, count_model_work, implementation, paired_timing, transformers_greedy)
from workshop.serving.workloads import sample_prompts, with_eos_inside
import gpt
from gpt import EOS_TOKEN_ID

HINTS = "exercises/hints/ex1.md"
DIFFERENTIAL_API = {"generate": "test_differential"}  # each public name of the stub -> the check that runs it against the reference
STEP_HINT = f"Hint: positions 0..T-1 for the whole sequence, the argmax of the LAST position (see {HINTS}, generate: one step, hint 2)."
STOP_HINT = f"see {HINTS}, generate: the loop and when to stop"


@pytest.fixture(scope="module")
def student():
    return implementation("ex1_generate")


@pytest.fixture(scope="module")
def cases(model, seed):
    """Seeded prompts of different lengths, each with its own number of new tokens; every other prompt
    has GPT-2's <|endoftext|> (the default EOS, also its pad id) somewhere inside, as real text does."""
    rng = random.Random(seed)
    prompts = with_eos_inside(sample_prompts(model, 6, 2, 40, seed), seed)
    return [(prompt, rng.randint(2, 24)) for prompt in prompts]


def test_matches_reference(student, model, tokenizer, cases):
    assert_generates_like(student.generate, lambda prompt, n: reference.generate(model, prompt, n), model, tokenizer, cases,
                          "the reference", STEP_HINT)


def test_matches_transformers(student, model, hf_model, tokenizer, cases):
    assert_generates_like(student.generate, lambda prompt, n: transformers_greedy(hf_model, prompt, n, EOS_TOKEN_ID), model,
                          tokenizer, cases, "transformers' greedy generate", STEP_HINT)


def test_eos_inside_the_prompt_is_an_ordinary_token(student, model, tokenizer, cases):
    """<|endoftext|> in the prompt (documents joined, or GPT-2's pad id) neither stops generation nor goes missing."""
    assert_eos_in_prompt_is_text(student.generate, reference.generate, model, tokenizer, cases, EOS_TOKEN_ID, f"{STOP_HINT}, hint 1")


def test_stops_right_after_eos(student, model, tokenizer, cases, seed):
    """Generation stops right after the model's EOS, returns it, and runs no forward pass after it."""
    assert_stops_right_after_eos(student.generate, reference.generate, model, tokenizer, [p for p, _ in cases], seed,
                                 f"{STOP_HINT}, hint 1", f"{STOP_HINT}, hint 2")


def test_returns_max_new_tokens(student, model, cases):
    for prompt, n in cases:
        got = student.generate(model, prompt, n, eos_token_id=-1)  # an EOS that never comes
        assert len(got) == n, (f"asked for max_new_tokens={n} (and no EOS can occur), got {plural(len(got), 'token')} back; return only "
                               f"the NEW tokens, not the prompt ({STOP_HINT}, hint 2).")


def test_cost_is_quadratic(student, model, cases):
    """Naive generation re-runs the whole sequence every step: step t pushes len(prompt) + t tokens."""
    for prompt, n in cases:
        with count_model_work(model) as work:
            student.generate(model, prompt, n, eos_token_id=-1)
        expected = sum(len(prompt) + t for t in range(n))
        assert work.forward_passes == n, f"expected one forward pass per new token ({n}), counted {work.forward_passes}."
        assert work.tokens == expected, (f"expected {expected} token positions through the model for a {len(prompt)}-token "
                                         f"prompt and {n} new tokens (the whole sequence every step), counted {work.tokens} "
                                         f"(see {HINTS}, generate: one step, hint 1).")


@st.composite
def scenarios(draw):
    """A model (tiny, or a random one of other sizes and a short context); a request that can run (four in five: a prompt
    of 1 token up to one short of the context, max_new_tokens from 1 to what is left of it, both biased to their
    edges) or one that cannot (an empty prompt, max_new_tokens 0 or -1, one token past the context, a token outside the vocabulary); an EOS that is the
    default, never produced (-1), or the k-th token the reference generates (k = 0, 1, 2: resolved by check)."""
    config = draw(st.one_of(st.none(), small_config()))
    # A small model's dtype is drawn (float16, bfloat16 too); tiny stays float32. Every naive step computes the logits of
    # the whole sequence, and half-precision matmuls are slow on a CPU: a half model's context is 16 positions.
    dtype = draw(dtypes()) if config else torch.float32
    if dtype != torch.float32:
        config = dataclasses.replace(config, n_positions=16)
    context = config.n_positions if config else 64  # tiny's own context is longer: its requests stay short, for time
    eos = draw(st.sampled_from(["default", -1, 0, 1, 2]))
    if draw(st.integers(0, 4)) == 0:  # a request that cannot run: the reference's error, exactly
        kind = draw(st.sampled_from(["empty prompt", "no new tokens", "past the context", "a token outside the vocabulary"]))
        length = 0 if kind == "empty prompt" else draw(st.integers(1, context - 1))
        max_new = {"empty prompt": 1, "no new tokens": draw(st.sampled_from([0, -1])), "past the context": context - length + 1,
                   "a token outside the vocabulary": 1}[kind]
        prompt = draw(st.lists(token_ids(), min_size=length, max_size=length))
        if kind == "a token outside the vocabulary":  # the given check_request refuses it (gpt.InvalidIndex) before any kernel
            prompt[draw(st.integers(0, length - 1))] = draw(st.sampled_from([-1, gpt.GPTConfig.vocab_size, 10**6]))
        return config, prompt, max_new, eos, dtype
    prompt = draw(prompts(1, context - 1, min_len=1, max_len=context - 1))
    left = context - len(prompt)
    max_new = draw(around(1, 2, left, low=1, high=min(left, 24 if dtype == torch.float32 else 6)))
    return config, prompt, max_new, eos, dtype


def observe_generate(generate, model, prompt, max_new, kwargs):
    """What the contract promises of one call: the new tokens (a list of ints; greedy, so near ties tolerated), the
    forward passes and the token positions through the model."""
    with count_model_work(model) as work:
        tokens = generate(model, prompt, max_new, **kwargs)
    return {"new tokens": GreedyTokens(tokens, model, tuple(prompt)), "forward passes": work.forward_passes,
            "token positions through the model": work.tokens}


def test_differential(student, model, seed):
    """Generated scenarios against the reference, compared over all the contract promises after the call: the new
    tokens and their type, one forward pass per token of the whole sequence, the prompt unchanged, an error exactly where
    the reference raises one."""
    def check(scenario):
        config, prompt, max_new, eos, dtype = scenario
        m = small_model(config, model.device, dtype=dtype) if config else model
        kwargs = {}
        if isinstance(eos, tuple):  # an explicit id (the edges: id 0 is a legal EOS, and falsy)
            kwargs["eos_token_id"] = eos[1]
        elif eos != "default":
            kwargs["eos_token_id"] = eos
            if eos >= 0:  # the eos-th token the reference produces, so that the model does produce it
                runs = prompt and 1 <= max_new <= m.config.n_positions - len(prompt) and all(0 <= t < m.config.vocab_size for t in prompt)
                produced = reference.generate(m, prompt, max_new, -1) if runs else []
                kwargs["eos_token_id"] = produced[min(eos, len(produced) - 1)] if produced else -1
        twins = Twins(reference, student, hint=STEP_HINT)
        call = f"generate({dtype_name(dtype)} model with {m.config.n_layer} layers, {m.config.n_head} heads, width {m.config.n_embd}; prompt={prompt}, max_new_tokens={max_new}{''.join(f', {k}={v}' for k, v in kwargs.items())})"
        twins.call(call, lambda side, p: observe_generate(side.generate, m, p, max_new, kwargs), inputs=(prompt,), again=True)

    explore(scenarios(), check, seed=seed, examples=40, edges=EDGES)


# Tried first at every seed: an EOS of id 0 that the model produces first ("What, ho" -> "!": falsy, and legal), and a
# short context filled to its last position, or one short of it.
_SHORT = gpt.GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2)
EDGES = [(None, [2061, 11, 8169], 4, ("id", 0), torch.float32), (None, [22087, 11, 8169], 3, ("id", 0), torch.float32),
         (_SHORT, list(range(100, 115)), 1, "default", torch.float32), (_SHORT, list(range(100, 114)), 2, -1, torch.bfloat16),
         (_SHORT, [5], 15, -1, torch.float32), (_SHORT, [5, 6], 4, -1, torch.float16)]


@pytest.mark.timing
def test_speed_against_reference(student, model, tokenizer, device, cases):
    prompt = cases[0][0]
    problem = compare_tokens(student.generate(model, prompt, 16), reference.generate(model, prompt, 16), model, prompt, tokenizer)
    assert problem is None, f"correctness first: see the other checks.\n{problem}"
    timing = paired_timing(lambda: student.generate(model, prompt, 16), lambda: reference.generate(model, prompt, 16), device=device)
    limit = 2.0 if device == "cpu" else 1.5
    assert timing.ratio < limit, (f"your generate takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n"
                                  f"{timing.report('yours', 'reference')}\nHint: avoid Python loops over tokens or vocab; keep tensors on the model's device.")
