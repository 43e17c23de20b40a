"""Checker for exercise 6, decoding strategies: pytest exercises/test_ex6_decoding.py (-k 6a, 6b, 6c, 6d)

6a and 6c are compared with transformers' own code (its logits processors, generate(num_beams=...)),
6b with the distribution it must sample (a chi-square test), 6d with generate(stop_strings=...) and
with the streaming rule. Parts are independent: 6c and 6d never call your 6a/6b code.
"""

import copy
import dataclasses
import functools
import random

import pytest
import torch
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import solutions.ex6_decoding as reference
from solutions.ex6_decoding import FILTERED
from gpt import EOS_TOKEN_ID, GPTConfig
from workshop.grading.differential import Tolerance, Twins, explore, type_name
from workshop.grading.harness import chi_square_p_value, count_model_work, implementation, paired_timing, refused
from workshop.grading.scenarios import around, small_config, small_model, tied_logits
from workshop.grading.wording import plural
from workshop.serving.sampling import GREEDY, SamplingParams
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex6.md"
NEWLINE = 198  # "\n": an end-of-hypothesis token the tiny model actually produces (its EOS it never does)
SIGNIFICANCE = 1e-5  # a correct sampler fails a chi-square test once in 100,000 runs
# each public name of the stub -> the check that runs it against the reference on generated scenarios
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "6a": ["apply_repetition_penalty", "apply_temperature", "apply_top_k", "apply_top_p", "apply_min_p"],
    "6b": ["filter_logits", "draw_multinomial", "draw_exponential_race", "sample"],
    "6c": ["beam_search"],
    "6d": ["StopChecker.add", "StopChecker._safe_length"],
}
DIFFERENTIAL_API = {name: "test_differential_6a_processors" for name in
                    ("apply_repetition_penalty", "apply_temperature", "apply_top_k", "apply_top_p", "apply_min_p")}
DIFFERENTIAL_API |= {name: "test_differential_6b_sampler" for name in ("filter_logits", "draw_multinomial", "draw_exponential_race", "sample")}
DIFFERENTIAL_API |= {"Hypothesis": "test_differential_6c_beam_search", "beam_search": "test_differential_6c_beam_search"}
DIFFERENTIAL_API |= {name: "test_differential_6d_stop_checker" for name in
                     ("StopChecker", "StopChecker.add", "StopChecker.finished", "Completion", "generate")}


@pytest.fixture(scope="module")
def student():
    return implementation("ex6_decoding")


@pytest.fixture(scope="module")
def real_logits(model, seed):
    """The tiny model's next-token logits after 6 seeded prompts: peaked, as an engine sees them."""
    prompts = sample_prompts(model, 6, 3, 30, seed=seed)
    rows = []
    with torch.no_grad():
        for p in prompts:
            rows.append(model(torch.tensor([p], device=model.device), torch.arange(len(p), device=model.device)[None])[0, -1])
    return torch.stack(rows).float().cpu()


def random_logits(seed, rows=6, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * torch.rand(rows, 1, generator=g).mul(4).add(0.5)


def assert_rows_equal(got, expected, what, params):
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (
        f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {getattr(got, 'shape', type(got).__name__)}.")
    for i, (g, e) in enumerate(zip(got, expected)):
        if not torch.equal(g, e):
            kept_g, kept_e = torch.isfinite(g).sum().item(), torch.isfinite(e).sum().item()
            diff = (g != e).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{what}, row {i} (parameter {params[i]!r}): {kept_g} tokens kept, transformers keeps {kept_e}; "
                                 f"first differing token ids {diff}: yours {g[diff].tolist()}, transformers {e[diff].tolist()}. "
                                 f"Removed tokens must be -inf, kept ones unchanged (or divided by the temperature).")


def by_transformers(warper, logits, params, input_ids=None):
    """Each row through transformers' processor built with that row's parameter."""
    ids = input_ids if input_ids is not None else torch.zeros(len(logits), 1, dtype=torch.long)
    return torch.stack([warper(p)(ids[i:i + 1], logits[i:i + 1].clone())[0] for i, p in enumerate(params)])


# ----------------------------------------------------------------------------------------------
# 6a: the processors

def test_6a_temperature_equals_transformers(student, real_logits, seed):
    temps = [1e-4, 0.3, 0.7, 1.0, 1.5, 4.0]
    for logits, what in ((random_logits(seed), "random logits"), (real_logits, "the model's logits")):
        assert_rows_equal(student.apply_temperature(logits, temps), by_transformers(TemperatureLogitsWarper, logits, temps),
                          f"apply_temperature on {what}", temps)


def test_6a_temperature_zero_is_greedy(student, real_logits):
    """T = 0 must not divide by zero: the row keeps only its argmax (the first one, on a tie)."""
    logits = real_logits.clone()
    logits[0, 7] = logits[0].max()  # a tie for the first place at a low index
    temps = [0.0, 1.0, 0.0, 0.5, 0.0, 2.0]
    got = student.apply_temperature(logits, temps)
    for i, t in enumerate(temps):
        if t == 0:
            kept = torch.isfinite(got[i]).nonzero().flatten().tolist()
            best = int(logits[i].argmax())
            assert kept == [best] and got[i, best] == logits[i, best], (
                f"row {i}, temperature 0: expected only token {best} (the argmax, logit unchanged) left, got tokens {kept[:5]} "
                f"(no NaN, no inf from dividing by 0).")
        else:
            assert torch.equal(got[i], logits[i] / t), f"row {i}: temperature {t} should divide the logits by {t}."


def test_6a_top_k_equals_transformers(student, real_logits, seed):
    small = random_logits(seed + 1)
    vocab = real_logits.shape[1]
    for logits, ks, what in ((small, [1, 2, 10, 50, 999, 1000], "random logits, vocabulary 1,000"),
                             (real_logits, [1, 5, 40, vocab - 1, vocab, vocab + 10], "the model's logits")):
        assert_rows_equal(student.apply_top_k(logits, ks), by_transformers(TopKLogitsWarper, logits, ks), f"apply_top_k on {what}", ks)
    off = student.apply_top_k(real_logits, [0] * len(real_logits))
    assert torch.equal(off, real_logits), "top_k = 0 means no top-k: the logits must come back unchanged."


def test_6a_top_k_keeps_ties_with_the_kth(student):
    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    got = student.apply_top_k(logits, [2, 1])
    assert torch.isfinite(got[0]).tolist() == [True, True, True, True, False, False], (
        "tie rule: with top_k = 2 on logits [5, 3, 3, 3, 1, 0] the three tokens tied with the 2nd are all kept (as transformers does).")
    assert torch.isfinite(got[1]).all(), "tie rule: six equal logits with top_k = 1: all are tied with the 1st, all stay."


# Rounding at the top-p boundary. transformers drops a token when its "tail mass" (its probability plus that of
# every less likely token: a float32 cumulative sum over up to 50,257 tokens) is <= 1 - top_p. On the model's
# rows, about one seed in nine puts some token's tail mass within float32 rounding of 1 - top_p, where a correct
# implementation keeps or drops it depending on whether it computes 1 - top_p in Python (as transformers does)
# or in float32, or compares in float64: rounding, not a rule. Such a token (tail mass within TOP_P_ROUNDING of
# 1 - top_p, about 8 times the float32 cumulative sum's own error measured here) is accepted either way, and
# so is a token whose logit ties exactly with the lowest one transformers keeps (the stated tie rule keeps it,
# transformers keeps or drops it by sort order; the model's fp16 weights make such ties happen, seeds 63 and 80).
# Every other token must be kept or dropped as transformers does.
TOP_P_ROUNDING = 1e-6


def assert_top_p_rows(got, logits, ps, what):
    expected = by_transformers(TopPLogitsWarper, logits, ps)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (
        f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {getattr(got, 'shape', type(got).__name__)}.")
    for i, (g, e, p) in enumerate(zip(got, expected, ps)):
        if torch.equal(g, e):
            continue
        ascending = logits[i].double().sort()
        tail = torch.empty_like(ascending.values).scatter_(0, ascending.indices, ascending.values.softmax(0).cumsum(0))
        rounding = (tail - (1 - p)).abs() <= TOP_P_ROUNDING if p < 1 else torch.zeros_like(tail, dtype=torch.bool)
        tied = logits[i] == logits[i][torch.isfinite(e)].min()  # tie rule: tied with the lowest kept, kept (transformers: by sort order)
        either = (rounding | tied) & ((g == logits[i]) | (g == FILTERED))  # kept unchanged, or removed: both fine there
        wrong = ((g != e) & ~either).nonzero().flatten()
        if len(wrong):
            t = wrong[:5].tolist()
            raise AssertionError(
                f"{what}, row {i} (top_p {p!r}): {torch.isfinite(g).sum().item()} tokens kept, transformers keeps "
                f"{torch.isfinite(e).sum().item()}; first differing token ids {t}: yours {g[t].tolist()}, transformers {e[t].tolist()} "
                f"(their tail mass, the probability of the token and every less likely one: {[round(x, 9) for x in tail[t].tolist()]}; "
                f"dropped when <= 1 - top_p = {1 - p:.9g}). Removed tokens must be -inf, kept ones unchanged. Only a token whose "
                f"tail mass is within {TOP_P_ROUNDING} of 1 - top_p may go either way (float rounding); see {HINTS}, 6a: apply_top_p.")


def test_6a_top_p_equals_transformers(student, real_logits, seed):
    """Equal to transformers' TopPLogitsWarper, token for token, except where a token's tail mass is within
    float32 rounding of 1 - top_p (see TOP_P_ROUNDING): there keeping and dropping are both accepted."""
    ps = [1e-9, 0.05, 0.5, 0.9, 0.999, 1.0]
    for logits, what in ((random_logits(seed + 2), "random logits"), (real_logits, "the model's logits")):
        assert_top_p_rows(student.apply_top_p(logits, ps), logits, ps, f"apply_top_p on {what}")


def test_6a_top_p_keeps_the_token_that_crosses_p(student):
    """probabilities 0.5, 0.3, 0.2: top_p = 0.6 keeps the first two (0.5 < 0.6, the second crosses it),
    0.5 keeps only the first (it reaches p), 0.1 still keeps one; and tied tokens stay together."""
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()[None].repeat(4, 1)
    got = student.apply_top_p(logits, [0.6, 0.5, 0.1, 0.81])
    expected = [[True, True, False], [True, False, False], [True, False, False], [True, True, True]]
    assert torch.isfinite(got).tolist() == expected, (
        f"probabilities [0.5, 0.3, 0.2] with top_p 0.6, 0.5, 0.1, 0.81: expected kept {expected}, got {torch.isfinite(got).tolist()}. "
        f"Keep the smallest set of most likely tokens whose probability reaches top_p, the crossing token included.")
    tied = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    got = student.apply_top_p(tied, [0.5])
    assert torch.isfinite(got).all(), ("tie rule: probabilities [0.4, 0.2, 0.2, 0.2], top_p 0.5: the crossing token is tied with two "
                                        "others; keep every token whose logit is >= the lowest one kept (all four).")


def test_6a_min_p_equals_transformers(student, real_logits, seed):
    ps = [0.0, 0.01, 0.05, 0.2, 0.5, 1.0]
    for logits, what in ((random_logits(seed + 3), "random logits"), (real_logits, "the model's logits")):
        assert_rows_equal(student.apply_min_p(logits, ps), by_transformers(MinPLogitsWarper, logits, ps), f"apply_min_p on {what}", ps)


def test_6a_repetition_penalty_equals_transformers(student, real_logits, seed):
    rng = random.Random(seed)
    logits = torch.cat([random_logits(seed + 4, vocab=real_logits.shape[1]), real_logits])
    penalties = [rng.choice([0.8, 1.2, 1.5, 2.0]) for _ in range(len(logits))]
    histories = [[rng.randrange(logits.shape[1]) for _ in range(rng.randint(1, 40))] for _ in range(len(logits))]
    histories[1] = histories[1][:1] * 5  # a repeated token is penalised once
    expected = torch.stack([RepetitionPenaltyLogitsProcessor(p)(torch.tensor([h]), logits[i:i + 1].clone())[0]
                            for i, (p, h) in enumerate(zip(penalties, histories))])
    assert_rows_equal(student.apply_repetition_penalty(logits, histories, penalties), expected, "apply_repetition_penalty", penalties)


# ----------------------------------------------------------------------------------------------
# 6b: the sampler

MIXED = [GREEDY, SamplingParams(temperature=0.7, top_k=50), SamplingParams(top_p=0.8), SamplingParams(temperature=1.3, min_p=0.05),
         SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.3), SamplingParams(temperature=0.0, repetition_penalty=1.5)]


def transformers_chain(params, history):
    chain = []
    if params.repetition_penalty != 1:
        chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.temperature > 0:
        chain.append(TemperatureLogitsWarper(params.temperature))
    if 0 < params.top_k:
        chain.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        chain.append(TopPLogitsWarper(params.top_p))
    if params.min_p > 0:
        chain.append(MinPLogitsWarper(params.min_p))
    return chain


def test_6b_filter_logits_applies_the_processors_in_order(student, real_logits, seed):
    """repetition penalty -> temperature -> top-k -> top-p -> min-p, as transformers' generate chains them."""
    rng = random.Random(seed)
    histories = [[rng.randrange(50257) for _ in range(20)] for _ in MIXED]
    got = student.filter_logits(real_logits, MIXED, histories)
    for i, (params, history) in enumerate(zip(MIXED, histories)):
        expected = real_logits[i:i + 1].clone()
        for processor in transformers_chain(params, history):
            expected = processor(torch.tensor([history]), expected)
        if params.greedy:  # greedy keeps only the argmax of the penalised logits
            assert torch.isfinite(got[i]).nonzero().flatten().tolist() == [int(expected.argmax())], (
                f"row {i} ({params}): greedy must keep only the argmax of the (penalised) logits.")
            continue
        assert torch.equal(got[i], expected[0]), (
            f"row {i} ({params}): filter_logits differs from transformers' chain {[type(p).__name__ for p in transformers_chain(params, history)]} "
            f"({torch.isfinite(got[i]).sum().item()} tokens kept, expected {torch.isfinite(expected).sum().item()}). "
            f"The order matters: temperature changes the probabilities that top-p and min-p cut by.")


def test_6b_filter_logits_returns_float32_for_any_float_dtype(student, real_logits, seed):
    """Logits of any float dtype (an engine on a GPU hands fp16 or bf16 over) come back as float32 [B, V], filtered
    as the same numbers in float32 are."""
    rng = random.Random(seed + 25)
    histories = [[rng.randrange(real_logits.shape[1]) for _ in range(20)] for _ in MIXED]
    for dtype in (torch.float16, torch.bfloat16):
        logits = real_logits.to(dtype)
        got = student.filter_logits(logits, MIXED, histories)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == real_logits.shape, (
            f"filter_logits on {dtype} logits returned {getattr(got, 'dtype', type(got).__name__)} "
            f"{tuple(getattr(got, 'shape', ()))}: logits of any float dtype come back as float32 [B, V] (see {HINTS}, 6b: filter_logits).")
        expected = student.filter_logits(logits.float(), MIXED, histories)
        assert torch.equal(torch.isfinite(got), torch.isfinite(expected)), (
            f"filter_logits on {dtype} logits keeps other tokens than on the same numbers in float32: convert to float32 "
            f"first, then filter (see {HINTS}, 6b: filter_logits).")


def test_6b_greedy_top_k_1_and_tiny_temperature_give_the_argmax(student, real_logits):
    argmax = real_logits.argmax(dim=1).tolist()
    for params in (GREEDY, SamplingParams(top_k=1, seed=0), SamplingParams(temperature=1e-5, seed=1)):
        generators = [torch.Generator().manual_seed(i) for i in range(len(real_logits))]
        got = student.sample(real_logits, [params] * len(real_logits), generators)
        assert got == argmax, f"sample() with {params}: expected the argmax {argmax}, got {got}."


DRAWS = 40_000


@pytest.mark.parametrize("draw", ["draw_multinomial", "draw_exponential_race"])
def test_6b_draws_follow_the_distribution(student, seed, draw):
    """DRAWS draws from a 12-token distribution: a chi-square goodness-of-fit test at significance
    1e-5 (a correct sampler fails once in 100,000 runs), and a zero-probability token never drawn."""
    logits = torch.tensor([2.0, 1.5, 1.4, 1.0, 0.7, 0.5, 0.2, 0.0, -0.5, -1.0, -1.5, -float("inf")])
    probs = logits.softmax(0)
    generator = torch.Generator().manual_seed(seed)
    tokens = getattr(student, draw)(probs[None].expand(DRAWS, -1).contiguous(), [generator] * DRAWS)
    assert isinstance(tokens, list) and len(tokens) == DRAWS, f"{draw} must return one token per row ({DRAWS}), got {type(tokens).__name__}."
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probs)).double()
    assert counts[-1] == 0, f"{draw} drew token 11, whose probability is 0, {int(counts[-1])} times."
    p, stat = chi_square_p_value(counts[:-1], probs[:-1].double())
    assert p > SIGNIFICANCE, (f"{draw}: the draws do not follow the probabilities (chi-square {stat:.1f}, 10 degrees of freedom, "
                              f"p = {p:.2e} < {SIGNIFICANCE}).\n  counts   {counts[:-1].long().tolist()}\n  expected "
                              f"{[round(x) for x in (probs[:-1] * DRAWS).tolist()]}")


def test_6b_sample_draws_from_the_filtered_distribution(student, seed):
    """sample() with temperature 0.7, top-k 6 and top-p 0.9: tokens outside the filtered set never come,
    the others at the filtered probabilities (chi-square, significance 1e-5)."""
    logits = torch.tensor([[2.0, 1.5, 1.4, 1.0, 0.7, 0.5, 0.2, 0.0, -0.5, -1.0]])
    params = SamplingParams(temperature=0.7, top_k=6, top_p=0.9)
    filtered = reference.filter_logits(logits, [params])[0]
    probs = filtered.softmax(0).double()
    generator = torch.Generator().manual_seed(seed)
    draws = 8_000
    tokens = student.sample(logits.expand(draws, -1).contiguous(), [params] * draws, [generator] * draws)
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probs)).double()
    allowed = probs > 0
    assert counts[~allowed].sum() == 0, (f"sample() drew filtered-out tokens {(~allowed).nonzero().flatten().tolist()} "
                                         f"{int(counts[~allowed].sum())} times; {params} keeps only {allowed.nonzero().flatten().tolist()}.")
    p, stat = chi_square_p_value(counts[allowed], probs[allowed])
    assert p > SIGNIFICANCE, (f"sample() with {params}: draws do not follow the filtered probabilities (chi-square {stat:.1f}, p = {p:.2e}).\n"
                              f"  counts   {counts[allowed].long().tolist()}\n  expected {[round(x) for x in (probs[allowed] * draws).tolist()]}")


def test_6b_seeded_rows_repeat_and_do_not_depend_on_their_batch(student, real_logits, seed):
    """Each row draws with its own generator: the same seeds give the same tokens, in a batch or alone,
    whatever the global random state; greedy rows share the batch. (A sampler that ignores the
    generators, or lets rows share one, fails this.)"""
    rows = list(range(len(MIXED))) * 8
    logits, params = real_logits[rows], [MIXED[r] for r in rows]
    histories = [[11, 198, 464 + r] for r in rows]
    seeds = [seed * 1000 + i for i in range(len(rows))]

    def generators():
        return [torch.Generator().manual_seed(s) for s in seeds]

    torch.manual_seed(seed)
    together = student.sample(logits, params, generators(), histories)
    torch.manual_seed(seed + 1)  # another global random state: it must not matter
    again = student.sample(logits, params, generators(), histories)
    assert again == together, "the same seeds gave different tokens in two runs: draw with the generators you are given, not torch's global one."
    alone = [student.sample(logits[i:i + 1], [params[i]], [generators()[i]], [histories[i]])[0] for i in range(len(rows))]
    differ = [i for i in range(len(rows)) if alone[i] != together[i]]
    assert not differ, (f"row {differ[0]} ({params[differ[0]]}) drew {together[differ[0]]} in the batch but {alone[differ[0]]} alone: "
                        f"each row must draw with its own generator only.")
    other = student.sample(logits, params, [torch.Generator().manual_seed(s + 1) for s in seeds], histories)
    assert other != together, "other seeds gave exactly the same tokens: the generators' seeds are not used."


def test_6b_sample_draws_with_draw_multinomial_by_default(student, seed):
    """draw=None means draw_multinomial: the same seeds give the same tokens with draw left out as with
    draw=draw_multinomial (and the exponential race is another draw: it need not agree)."""
    logits = random_logits(seed + 26, rows=24, vocab=500) / 3  # flat rows: the draw decides, never a sure token
    params = [SamplingParams(temperature=1.2, seed=seed + i) for i in range(len(logits))]
    seeds = [seed * 1000 + i for i in range(len(params))]
    default = student.sample(logits, params, [torch.Generator().manual_seed(s) for s in seeds])
    named = student.sample(logits, params, [torch.Generator().manual_seed(s) for s in seeds], draw=student.draw_multinomial)
    assert default == named, (
        f"sample() without draw gave {default[:8]}..., with draw=draw_multinomial {named[:8]}... for the same seeds: draw=None "
        f"means draw_multinomial (see {HINTS}, 6b: sample).")


def test_6b_greedy_rows_take_the_penalised_argmax(student, real_logits, seed):
    """A greedy request with a repetition penalty takes the argmax of its PENALISED logits, in a batch of greedy
    rows only and beside sampled rows; a greedy row without a penalty takes the plain argmax. Each history holds
    its row's favourite token, with a penalty strong enough to move the argmax, so skipping the penalty shows."""
    rng = random.Random(seed + 21)
    vocab = real_logits.shape[1]
    favourite = real_logits.argmax(dim=1).tolist()
    histories = [[favourite[i]] + [rng.randrange(vocab) for _ in range(rng.randint(0, 12))] for i in range(len(real_logits))]
    rng.shuffle(histories[0])
    penalty = 50.0
    penalised = torch.stack([RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([h]), real_logits[i:i + 1].clone())[0]
                             for i, h in enumerate(histories)]).argmax(dim=1).tolist()
    assert all(a != b for a, b in zip(penalised, favourite)), "checker bug: the penalty should move every row's argmax here."
    greedy_penalised = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    batches = [("a batch of greedy rows, all with the penalty", [greedy_penalised] * len(real_logits)),
               ("greedy rows with the penalty beside sampled rows and a plain greedy row",
                [greedy_penalised, SamplingParams(temperature=0.8, seed=1), GREEDY, greedy_penalised,
                 SamplingParams(top_k=5, repetition_penalty=1.3, seed=2), greedy_penalised])]
    for what, params in batches:
        generators = [torch.Generator().manual_seed(seed + i) for i in range(len(params))]
        got = student.sample(real_logits, params, generators, histories)
        assert isinstance(got, list) and len(got) == len(params), f"sample() must return one token per row ({len(params)}), got {got!r:.200}"
        for i, p in enumerate(params):
            if p.greedy:
                expected = penalised[i] if p.repetition_penalty != 1 else favourite[i]
                assert got[i] == expected, (
                    f"{what}: row {i} ({p}) took token {got[i]}; expected {expected}, the argmax of its "
                    f"{'penalised' if p.repetition_penalty != 1 else 'plain'} logits (its unpenalised argmax {favourite[i]} is in its "
                    f"history, penalty {p.repetition_penalty}). A greedy row skips the draw, not the processors: filter it like "
                    f"every other row (see {HINTS}, 6b: sample).")


@pytest.mark.parametrize("draw", ["draw_multinomial", "draw_exponential_race"])
def test_6b_a_greedy_row_leaves_its_generator_untouched(student, real_logits, seed, draw):
    """A greedy row draws nothing: after sample(), its generator is exactly as it was (a request's seeded stream
    must not move because it was greedy for a step), beside sampled rows, with or without a repetition penalty.
    (A sampler that draws for every row and then overwrites the greedy ones with their argmax fails this.)"""
    rng = random.Random(seed + 24)
    greedy_penalised = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    batches = [("greedy rows beside sampled rows", [GREEDY, SamplingParams(temperature=0.8), greedy_penalised,
                                                    SamplingParams(top_k=20), GREEDY, SamplingParams(top_p=0.9, min_p=0.02)]),
               ("greedy rows with a repetition penalty only", [greedy_penalised] * len(real_logits))]
    histories = [[rng.randrange(real_logits.shape[1]) for _ in range(rng.randint(1, 12))] for _ in range(len(real_logits))]
    for what, params in batches:
        generators = [torch.Generator().manual_seed(seed * 100 + i) for i in range(len(params))]
        states = [g.get_state() for g in generators]
        got = student.sample(real_logits, params, generators, histories, draw=getattr(student, draw))
        assert isinstance(got, list) and len(got) == len(params), f"sample() must return one token per row ({len(params)}), got {got!r:.200}"
        moved = [i for i, (p, g, state) in enumerate(zip(params, generators, states)) if p.greedy and not torch.equal(g.get_state(), state)]
        assert not moved, (
            f"sample(..., draw={draw}) on {what}: the generators of greedy rows {moved} ({[str(params[i]) for i in moved][:2]}) "
            f"moved. A greedy row takes the argmax of its filtered logits and draws nothing: its generator is not touched, "
            f"so a request's seeded draws do not depend on how many greedy steps it took. Draw only the sampled rows, each "
            f"with its own generator (see {HINTS}, 6b: sample).")


@pytest.mark.parametrize("draw", ["draw_multinomial", "draw_exponential_race"])
def test_6b_a_rows_draw_depends_only_on_its_own_seed(student, seed, draw):
    """A request's token depends on its own seed and probabilities only: not on its place in the batch, nor on
    its neighbours' seeds. The same rows are drawn in a shuffled order, with other seeds for half of them, and
    one at a time; every row that kept its seed must draw the same token (with draw, and through sample())."""
    rng = random.Random(seed + 22)
    rows, vocab = 10, 500
    logits = random_logits(seed + 23, rows=rows, vocab=vocab) / 3  # flat rows: the noise decides, never a sure token
    probs = logits.softmax(dim=1)
    seeds = [rng.randrange(2**40) for _ in range(rows)]

    def run(order, seed_of, through_sample):
        generators = [torch.Generator().manual_seed(seed_of[i]) for i in order]
        if through_sample:
            params = [SamplingParams(seed=seed_of[i]) for i in order]
            tokens = student.sample(logits[order], params, generators, draw=getattr(student, draw))
        else:
            tokens = getattr(student, draw)(probs[order].contiguous(), generators)
        assert isinstance(tokens, list) and len(tokens) == len(order), f"{draw} must return one token per row, got {tokens!r:.200}"
        return {row: token for row, token in zip(order, tokens)}

    for through_sample in (False, True):
        how = f"sample(..., draw={draw})" if through_sample else draw
        base = run(list(range(rows)), seeds, through_sample)
        shuffled = rng.sample(range(rows), rows)
        kept = set(rng.sample(range(rows), rows // 2))
        other_seeds = [s if i in kept else s + 7919 for i, s in enumerate(seeds)]
        trials = [(f"the batch shuffled (order {shuffled})", run(shuffled, seeds, through_sample), range(rows)),
                  ("other seeds for its neighbours", run(shuffled, other_seeds, through_sample), sorted(kept)),
                  ("alone in a batch of one", {i: run([i], seeds, through_sample)[i] for i in range(rows)}, range(rows))]
        for change, tokens, compared in trials:
            moved = [i for i in compared if tokens[i] != base[i]]
            assert not moved, (
                f"{how}: row {moved[0]} (seed {seeds[moved[0]]}) drew token {base[moved[0]]} at place {moved[0]} of the batch, "
                f"but {tokens[moved[0]]} with {change} ({len(moved)} of {len(list(compared))} rows changed). Each row must draw "
                f"its noise with its OWN generator, generators[i]: a row that draws with another row's generator, or one "
                f"generator for the whole batch, gets tokens that depend on its neighbours (see {HINTS}, 6b: draw_multinomial "
                f"and draw_exponential_race).")


# ----------------------------------------------------------------------------------------------
# 6c: beam search

BEAM_CASES = [(2, 1.0, EOS_TOKEN_ID), (3, 1.0, NEWLINE), (4, 0.5, NEWLINE), (4, 2.0, EOS_TOKEN_ID), (3, 2.0, NEWLINE)]


@torch.no_grad()
def total_logprob(model, prompt, tokens):
    """The log-probability the model gives `tokens` after the prompt, from one plain forward over prompt + tokens
    (no cache): what a hypothesis's total should be, whatever the search did."""
    ids = torch.tensor([list(prompt) + list(tokens)], device=model.device)
    logits = model(ids, torch.arange(ids.shape[1], device=model.device)[None])[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens, device=model.device)[:, None]).sum().item()


def wrong_score_cause(got, model, prompt, length_penalty):
    """The likely cause when a hypothesis's score is not total / len(tokens) ** length_penalty of its own tokens; else None."""
    for rank, h in enumerate(got):
        if not h.tokens:
            continue
        total, n = total_logprob(model, prompt, h.tokens), len(h.tokens)
        right = total / n ** length_penalty
        if abs(h.score - right) <= 1e-3:
            continue
        for other, how in ((total, "the plain total: no length penalty"), (total / n, "total / len: length_penalty ignored"),
                           (total / max(n - 1, 1) ** length_penalty, "total / (len - 1) ** length_penalty: the EOS not counted")):
            if abs(h.score - other) <= 1e-3:
                return (f"  Likely cause: your hypothesis {rank} scores {h.score:.4f}, which is {how}; it should score "
                        f"total / len(tokens) ** length_penalty = {total:.4f} / {n} ** {length_penalty} = {right:.4f}.")
        return (f"  Likely cause: your hypothesis {rank} scores {h.score:.4f}, but the model gives its own tokens {right:.4f} "
                f"after the prompt (one plain forward, no cache, / len ** length_penalty): they were scored with logits computed "
                f"on another beam's past. After choosing the next beams, reorder the cache rows so that each new beam continues "
                f"its PARENT's keys and values, and feed each beam's last token at position len(prompt) + step.")
    return None


def describe_beam_mismatch(got, expected, model, tokenizer, prompt, length_penalty, setting):
    """None when every hypothesis matches; else where the first one differs (rank, new token, texts) and the
    likely cause, found by rescoring your hypotheses with a plain forward."""
    tokens = [h.tokens for h in got]
    rank = next((r for r, (g, e) in enumerate(zip(tokens, expected)) if g != e), None)
    if rank is None:
        return None
    g, e = tokens[rank], expected[rank]
    i = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
    show = lambda t: f"{t} ({tokenizer.decode([t])!r})"  # noqa: E731
    lines = [f"{setting}: hypothesis {rank} (best first) differs from transformers' at new token {i} (step {i}):"]
    if i < len(g) and i < len(e):
        lines.append(f"  yours has {show(g[i])} there, transformers {show(e[i])}")
    else:
        lines.append(f"  yours {'ends' if i == len(g) else 'goes on'} there; transformers' {'goes on with ' + show(e[i]) if i < len(e) else 'ends'}")
    lines += [f"  prompt ({plural(len(prompt), 'token')}): ...{tokenizer.decode(prompt)[-80:]!r}",
              f"  yours:         {tokenizer.decode(g)!r} {g}",
              f"  transformers': {tokenizer.decode(e)!r} {e}"]
    cause = wrong_score_cause(got, model, prompt, length_penalty)
    if cause:
        lines.append(cause)
    elif g in expected:
        lines.append(f"  Likely cause: transformers finds your hypothesis too, but ranks it {expected.index(g)}: rank the finished "
                     f"hypotheses by total log-probability / len(tokens) ** length_penalty, the EOS token counted in len, best first.")
    else:
        lines.append("  Likely cause: your search keeps other candidates than transformers' (your scores are right for your tokens): "
                     "each step take the 2 * num_beams best (beam, token) pairs in order; one ending in EOS (or at the last step) "
                     "finishes only if it ranks among the first num_beams; the first num_beams others are the next beams; stop early "
                     "only when num_beams are finished and the best running beam cannot beat the worst of them.")
    return "\n".join(lines + [f"  See {HINTS}, 6c: beam_search."])


@pytest.mark.parametrize("num_beams, length_penalty, eos", BEAM_CASES)
def test_6c_beam_search_equals_transformers(student, model, hf_model, tokenizer, seed, num_beams, length_penalty, eos):
    """All num_beams hypotheses, in order, with their scores, equal transformers' generate(num_beams=...,
    do_sample=False, early_stopping=False, num_return_sequences=num_beams). With eos = "\\n" hypotheses end early."""
    prompts = sample_prompts(model, 2, 4, 24, seed=seed + num_beams)
    new = 14
    setting = f"num_beams={num_beams}, length_penalty={length_penalty}, eos={eos}"
    for prompt in prompts:
        got = student.beam_search(model, prompt, num_beams, new, length_penalty=length_penalty, eos_token_id=eos)
        out = hf_model.generate(torch.tensor([prompt], device=model.device), num_beams=num_beams, do_sample=False, max_new_tokens=new,
                                length_penalty=length_penalty, early_stopping=False, eos_token_id=eos, pad_token_id=eos,
                                num_return_sequences=num_beams, output_scores=True, return_dict_in_generate=True)
        expected = []
        for row in out.sequences[:, len(prompt):].tolist():
            expected.append(row[:row.index(eos) + 1] if eos in row else row)
        assert isinstance(got, list) and len(got) == num_beams and all(hasattr(h, "tokens") and hasattr(h, "score") for h in got), (
            f"{setting}: beam_search must return a list of num_beams = {num_beams} Hypothesis(tokens, score), best first; got "
            f"{got!r:.200} (see {HINTS}, 6c: beam_search).")
        problem = describe_beam_mismatch(got, expected, model, tokenizer, prompt, length_penalty, setting)
        assert problem is None, problem
        scores = torch.tensor([h.score for h in got])
        if not torch.allclose(scores, out.sequences_scores.cpu().float(), atol=1e-4):
            cause = wrong_score_cause(got, model, prompt, length_penalty) or (
                "  Likely cause: a hypothesis scores its total log-probability (log_softmax in float32) / len(tokens) ** "
                "length_penalty, the EOS token counted in len.")
            raise AssertionError(f"{setting}: the right hypotheses (prompt ...{tokenizer.decode(prompt)[-80:]!r}), but scores "
                                 f"{[round(x, 5) for x in scores.tolist()]}, transformers' {[round(x, 5) for x in out.sequences_scores.tolist()]}.\n"
                                 f"{cause}\n  See {HINTS}, 6c: beam_search.")


def test_6c_bad_beam_search_is_refused(student, model):
    """num_beams < 1, and a request check_request refuses (an empty prompt, max_new_tokens < 1): a ValueError with one
    clear sentence, before any forward."""
    prompt = sample_prompts(model, 1, 5, 5, seed=3)[0]
    for args, why in (((prompt, 0, 5), "num_beams=0"), ((prompt, -2, 5), "num_beams=-2"), (([], 2, 5), "an empty prompt"),
                      ((prompt, 2, 0), "max_new_tokens=0")):
        with count_model_work(model) as work, refused(ValueError, f"beam_search with {why}") as error:
            student.beam_search(model, *args)
        message = str(error.value).strip()
        assert message and "\n" not in message and work.forward_passes == 0, (
            f"beam_search with {why} must raise ValueError with one clear sentence before any forward; it ran "
            f"{work.forward_passes} forwards and said {message!r} (see {HINTS}, 6c: beam_search).")


def test_6c_beam_search_prefills_once_then_runs_the_cache(student, model, seed):
    """One prefill of the prompt, then only the beams' new tokens through exercise 2's cache: at most num_beams
    token positions per step after the prompt, never the prompt or a beam's past again."""
    for num_beams, prompt in zip((2, 4), sample_prompts(model, 2, 12, 24, seed=seed + 11)):
        new = 10
        with count_model_work(model) as work:
            got = student.beam_search(model, prompt, num_beams, new, eos_token_id=NEWLINE)
        assert isinstance(got, list) and got, f"beam_search returned {got!r:.200}"
        most = len(prompt) + num_beams * (new - 1)
        assert work.projected_tokens <= most * model.config.n_layer and work.tokens <= most, (
            f"beam_search(num_beams={num_beams}, max_new_tokens={new}) on a {len(prompt)}-token prompt pushed {work.tokens} token "
            f"positions through the model in {work.forward_passes} forwards; one prefill and then each beam's new token "
            f"through the cache takes at most {len(prompt)} + {num_beams} x {new - 1} = {most}. Reorder the cache rows "
            f"to the new beams' parents instead of running their pasts again (see {HINTS}, 6c: beam_search).")


def test_6c_one_beam_is_greedy(student, model, seed):
    from solutions.ex2_kv_cache import generate as greedy
    for prompt in sample_prompts(model, 3, 3, 20, seed=seed + 9):
        got = student.beam_search(model, prompt, 1, 12, eos_token_id=NEWLINE)
        expected = greedy(model, prompt, 12, eos_token_id=NEWLINE)
        assert [h.tokens for h in got] == [expected], f"num_beams = 1 is greedy decoding: expected {expected}, got {[h.tokens for h in got]}."


# ----------------------------------------------------------------------------------------------
# 6d: stopping

def feed(checker, tokens):
    """Tokens into a StopChecker until it finishes: the pieces it released, one per token."""
    pieces = []
    for token in tokens:
        pieces.append(checker.add(token))
        if checker.finished:
            break
    return pieces


def boundary_stops(tokenizer, tokens, rng, count):
    """Stop strings cut out of the generated text that start inside one token and end inside a later one."""
    texts = [tokenizer.decode([t]) for t in tokens]
    starts = [sum(map(len, texts[:i])) for i in range(len(texts) + 1)]
    text, stops = "".join(texts), []
    for _ in range(50):
        i = rng.randrange(1, len(tokens) - 2)
        if len(texts[i]) < 2 or not texts[i].isascii():
            continue
        a = starts[i] + rng.randrange(1, len(texts[i]))
        b = min(len(text), starts[i + 1] + rng.randint(1, 3))
        stop = text[a:b]
        if stop.strip() and stop not in stops:
            stops.append(stop)
        if len(stops) == count:
            break
    return stops


def test_6d_stop_strings_across_tokens_equal_transformers(student, model, hf_model, tokenizer, seed):
    """Stop strings that start inside one token and end inside another: the new tokens equal transformers'
    generate(stop_strings=..., tokenizer=...), and the text is cut where the stop string starts."""
    from solutions.ex2_kv_cache import generate as greedy
    rng, compared = random.Random(seed), 0
    for prompt in sample_prompts(model, 2, 4, 16, seed=seed + 5):
        tokens = greedy(model, prompt, 32, eos_token_id=-1)
        full = tokenizer.decode(tokens)
        prompt_text = tokenizer.decode(prompt)
        for stop in boundary_stops(tokenizer, tokens, rng, 2):
            checker = student.StopChecker(tokenizer, [stop], max_new_tokens=32)
            pieces = feed(checker, tokens)
            cut = full.find(stop)
            assert checker.finished and checker.finish_reason == "stop", f"stop string {stop!r} is in the text {full!r} but generation did not stop."
            assert checker.text == full[:cut], f"stop string {stop!r}: the text should be {full[:cut]!r} (cut where it starts), got {checker.text!r}."
            assert "".join(pieces) == checker.text, f"the streamed pieces {pieces} do not add up to the final text {checker.text!r}."
            if stop in (prompt_text + full)[:len(prompt_text) + cut + len(stop) - 1]:
                continue  # transformers also matches across the prompt's end, we look at the new text only
            out = hf_model.generate(torch.tensor([prompt], device=model.device), do_sample=False, max_new_tokens=32, stop_strings=[stop],
                                    tokenizer=tokenizer, pad_token_id=EOS_TOKEN_ID)
            expected = out[0, len(prompt):].tolist()
            assert checker.token_ids == expected, (f"stop string {stop!r}: transformers stops after {plural(len(expected), 'token')} "
                                                   f"(the token that completes it), yours after {len(checker.token_ids)}.")
            compared += 1
    assert compared, "no stop string could be compared with transformers for this seed: run again with another --seed."


def test_6d_streaming_holds_back_a_possible_stop_string(student, tokenizer):
    """Text that may still become a stop string is held back, released as soon as it cannot; an
    incomplete UTF-8 character is held back too; the pieces add up to the final text."""
    cases = [("Hello wor", ["world!"], "Hello world is round"),  # 'wor', 'world' held, released at ' is'
             ("a lol", ["lo!"], "a lol lo! end"),
             ("fine 🦊 fox", ["xx"], "fine 🦊 fox runs"),  # the fox emoji is split over byte-level tokens
             ("The end", ["\n\n", "THE END"], "The end.\n\nMore")]
    for _, stops, text in cases:
        tokens = tokenizer.encode(text)
        got = feed(student.StopChecker(tokenizer, stops), tokens)
        expected = feed(reference.StopChecker(tokenizer, stops), tokens)
        assert got == expected, (f"stop strings {stops}, tokens {[tokenizer.decode([t]) for t in tokens]}: streamed pieces {got}, "
                                 f"expected {expected} (hold back only what may still become a stop string, or half a character).")


def test_6d_stop_tokens_and_max_new_tokens(student, tokenizer):
    tokens = tokenizer.encode("To be, or not to be") + [EOS_TOKEN_ID] + tokenizer.encode(" never")
    checker = student.StopChecker(tokenizer, [], stop_token_ids=[EOS_TOKEN_ID], max_new_tokens=50)
    pieces = feed(checker, tokens)
    assert checker.finish_reason == "stop" and checker.token_ids == tokens[:tokens.index(EOS_TOKEN_ID) + 1], (
        f"a stop token ends the request (its id kept in token_ids, as transformers returns it): got {checker.token_ids}, reason {checker.finish_reason!r}.")
    assert "".join(pieces) == checker.text == "To be, or not to be", f"the stop token's text must not be shown: got {checker.text!r}."
    checker = student.StopChecker(tokenizer, ["zzz"], max_new_tokens=3)
    feed(checker, tokens)
    assert checker.finish_reason == "length" and len(checker.token_ids) == 3, (
        f"max_new_tokens = 3: expected 3 tokens and finish_reason 'length', got {len(checker.token_ids)} and {checker.finish_reason!r}.")


def test_6d_streamed_pieces_add_up_to_the_final_text(student, model, tokenizer, seed):
    """Whatever ends a request (a stop token, a stop string, max_new_tokens), the pieces add() returned add up to
    the final text, with nothing shown twice and nothing kept back. Finishing by max_new_tokens right after a
    tail that could still have become a stop string, or in the middle of a UTF-8 character, flushes that tail:
    no further token will come to decide it. Seeded: the model's own text, cut at seeded places."""
    from solutions.ex2_kv_cache import generate as greedy
    rng = random.Random(seed + 41)
    emoji = tokenizer.encode(" fine 🦊 fox")  # the fox is spread over byte-level tokens
    half = next(i for i in range(1, len(emoji)) if tokenizer.decode(emoji[:i]).endswith("\ufffd"))
    cases = [(tokenizer.encode("Hello wor"), ["world"], None, "length"),  # ends on 'wor', the start of a stop string
             (emoji[:half], ["xx"], None, "length")]  # ends inside the fox's UTF-8 bytes
    for prompt in sample_prompts(model, 2, 4, 16, seed=seed + 42):
        tokens = greedy(model, prompt, 24, eos_token_id=-1)
        texts = [tokenizer.decode(tokens[:k]) for k in range(len(tokens) + 1)]
        k = rng.randint(4, len(tokens))  # finish by max_new_tokens after k tokens, with a stop string held back there
        tail = texts[k].rstrip("\ufffd")[-rng.randint(1, 3):]
        if tail:
            cases.append((tokens, [tail + "\x00never"], k, "length"))
        stop = next((st for st in boundary_stops(tokenizer, tokens, rng, 1)), None)
        if stop:
            cases.append((tokens, [stop], None, "stop"))
        eos_at = rng.randint(1, len(tokens) - 1)  # a stop token right after a tail that is held back
        held = texts[eos_at].rstrip("\ufffd")[-2:]
        cases.append((tokens[:eos_at] + [EOS_TOKEN_ID] + tokens[eos_at:], [held + "\x00"] if held else [], None, "stop"))
    for tokens, stops, max_new_tokens, reason in cases:
        checker = student.StopChecker(tokenizer, stops, max_new_tokens=max_new_tokens or len(tokens))
        pieces = feed(checker, tokens)
        used = checker.token_ids
        expected = reference.StopChecker(tokenizer, stops, max_new_tokens=max_new_tokens or len(tokens))
        feed(expected, tokens)
        where = (f"stop strings {stops!r}, max_new_tokens={max_new_tokens or len(tokens)}, tokens "
                 f"{[tokenizer.decode([t]) for t in tokens[:len(expected.token_ids)]]}")
        assert checker.finished and checker.finish_reason == expected.finish_reason == reason, (
            f"{where}: expected to finish with reason {reason!r} after {plural(len(expected.token_ids), 'token')}, got finished="
            f"{checker.finished}, reason {checker.finish_reason!r} after {plural(len(used), 'token')} (see {HINTS}, 6d).")
        assert checker.text == expected.text, f"{where}: the final text should be {expected.text!r}, got {checker.text!r} (see {HINTS}, 6d)."
        streamed = "".join(p for p in pieces if p)
        assert streamed == checker.text, (
            f"{where}, finished by {reason!r}: the streamed pieces {pieces} add up to {streamed!r}, but the final text is "
            f"{checker.text!r}. Once the request has finished, nothing can turn the held-back tail into a stop string or "
            f"complete its character: the last add() returns everything not sent yet, whatever ended the request "
            f"(see {HINTS}, 6d: StopChecker.add).")


def test_6d_the_earliest_stop_string_wins(student, tokenizer):
    """When one token completes several stop strings, the text is cut where the EARLIEST of them starts, whatever
    the order of the stop list: "Hello" then " world" with stops ["or", "world"] leaves "Hello "."""
    for text, stops, expected in (("Hello world", ["or", "world"], "Hello "), ("Hello world", ["world", "or"], "Hello "),
                                  ("To be, or not", ["not", "be, or", "or"], "To "), ("a lol lo", ["lo", "ol"], "a ")):
        checker = student.StopChecker(tokenizer, stops, max_new_tokens=50)
        pieces = feed(checker, tokenizer.encode(text))
        assert checker.finish_reason == "stop" and checker.text == expected and "".join(pieces) == expected, (
            f"stop strings {stops}, text {text!r} (tokens {[tokenizer.decode([t]) for t in tokenizer.encode(text)]}): finished "
            f"{checker.finish_reason!r} with text {checker.text!r}, streamed {pieces}; expected {expected!r}: the earliest stop "
            f"string in the text wins, wherever it is in the list (see {HINTS}, 6d: StopChecker.add).")


def test_6d_add_after_finishing_is_refused(student, tokenizer):
    """add() after the request finished (by a stop token, a stop string or max_new_tokens) is the caller's bug:
    RuntimeError, and the finished request stays as it was."""
    tokens = tokenizer.encode("Once upon a time") + [EOS_TOKEN_ID]
    for stops, stop_ids, max_new_tokens, how in (([], [EOS_TOKEN_ID], 50, "a stop token"), ([" a"], [], 50, "a stop string"),
                                                 ([], [], 2, "max_new_tokens")):
        checker = student.StopChecker(tokenizer, stops, stop_token_ids=stop_ids, max_new_tokens=max_new_tokens)
        feed(checker, tokens)
        assert checker.finished, f"the request should have finished by {how}: feed ran out first."
        kept = (list(checker.token_ids), checker.text, checker.finish_reason)
        with pytest.raises(RuntimeError):
            checker.add(tokens[0])
        assert (list(checker.token_ids), checker.text, checker.finish_reason) == kept, (
            f"add() after the request finished by {how} changed it: {kept} became "
            f"{(checker.token_ids, checker.text, checker.finish_reason)} (see {HINTS}, 6d: StopChecker.add).")


# ----------------------------------------------------------------------------------------------
# Differential checks: generated scenarios, the reference and yours fed the same calls and compared after each
# (workshop/grading/differential.py). A failure shows the smallest scenario hypothesis found, the calls, the first
# difference and the hint's section.

PROCESSOR_TOL = Tolerance(rtol=1e-6, atol=0.0)  # a kept logit is the input, divided or multiplied once: a few float32 steps
TEMPERATURES = [0.0, 1e-6, 1e-4, 0.5, 1.0, 2.0, 1e4]
TOP_PS = [1.0, 1e-9, 0.25, 0.5, 0.75, 0.9, 0.999]  # 0.25, 0.5, 0.75: cumulative boundaries that rows of tied logits meet exactly
MIN_PS = [0.0, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0]  # none within float rounding of e^-d, d a gap between two tied_logits values
PENALTIES = [1.0, 0.5, 0.9, 1.3, 2.0, 50.0]


def hint(section):
    return f"Hint: see {HINTS}, {section}."


def top_ks(vocab):
    """k at its edges: 0 (off), 1, 2, the vocabulary less one, all of it, past it."""
    return st.sampled_from(sorted({0, 1, 2, max(vocab - 1, 0), vocab, vocab + 1}))


def histories_of(rows, vocab):
    """Per row a history of 0 to 6 ids, repeated ids and the edge ids 0 and V - 1 frequent."""
    ids = st.one_of(st.just(0), st.just(vocab - 1), st.integers(0, vocab - 1))
    return st.lists(st.lists(ids, max_size=6), min_size=rows, max_size=rows)


def shown(logits):
    return f"{str(logits.dtype).removeprefix('torch.')} {logits.tolist()}"


def top_p_doubt(logits, top_ps):
    """The tokens top-p may keep or drop by float rounding (the contract's 1e-6): those whose logit v has a tail mass
    (the probability of every token with a logit <= v, in float64) within TOP_P_ROUNDING of 1 - top_p. Tokens tied
    with each other share one decision (the tie rule), so only a tie group's whole tail mass is in doubt; the most
    likely tokens always stay."""
    doubt = torch.zeros(logits.shape, dtype=torch.bool)
    for i, p in enumerate(top_ps):
        row = logits[i].double().cpu()
        probs = row.softmax(0)
        for v in row.unique():
            if v < row.max() and abs(float(probs[row <= v].sum()) - (1 - p)) <= TOP_P_ROUNDING:
                doubt[i] |= row == v
    return doubt


def settle(out, doubt=None):
    """Where the contract leaves a choice, the same reading on both sides: a token in doubt at the top-p boundary
    reads NaN, a finite logit whose probability is exactly 0 reads -inf (top-p at 1 may drop it or not). In place
    on the returned tensor (an output that shares the argument's storage then shows as a changed argument)."""
    if isinstance(out, torch.Tensor) and out.is_floating_point() and out.dim() == 2:
        with torch.no_grad():
            out.masked_fill_(out.float().softmax(dim=1) == 0, FILTERED)
            if doubt is not None and doubt.shape == out.shape:
                out.masked_fill_(doubt.to(out.device), float("nan"))
    return out


@st.composite
def processor_scenarios(draw):
    """Tied logits (-inf and +-30 among them; rows of one token too) and one parameter per row, each at its edges."""
    logits = draw(tied_logits(rows=(1, 4), vocab=(1, 12)))
    rows, vocab = logits.shape

    def per_row(values):
        return draw(st.lists(values, min_size=rows, max_size=rows))
    return logits, {"temperatures": per_row(st.sampled_from(TEMPERATURES)), "top_ks": per_row(top_ks(vocab)),
                    "top_ps": per_row(st.sampled_from(TOP_PS)), "min_ps": per_row(st.sampled_from(MIN_PS)),
                    "histories": draw(histories_of(rows, vocab)), "penalties": per_row(st.sampled_from(PENALTIES))}


def test_differential_6a_processors(student, seed):
    """Each processor on generated rows against the reference: exact ties, -inf, rows of one token, temperature 0,
    tiny and huge, top_k 0, 1, V - 1, V and past it, top_p 1, tiny and exactly at a tied row's cumulative boundary,
    min_p 0 and 1, penalties below and above 1 with repeated and empty histories. Compared: the new logits (dtype,
    shape, values within PROCESSOR_TOL; at the top-p boundary only tokens within its 1e-6 rounding may differ), the
    arguments unchanged, no storage shared with them, the same result twice."""
    def check(scenario):
        logits, p = scenario
        doubt = top_p_doubt(logits, p["top_ps"])
        calls = [("apply_repetition_penalty", f"histories={p['histories']}, penalties={p['penalties']}",
                  lambda side, x: side.apply_repetition_penalty(x, p["histories"], p["penalties"]), None),
                 ("apply_temperature", f"temperatures={p['temperatures']}", lambda side, x: side.apply_temperature(x, p["temperatures"]), None),
                 ("apply_top_k", f"top_ks={p['top_ks']}", lambda side, x: side.apply_top_k(x, p["top_ks"]), None),
                 ("apply_top_p", f"top_ps={p['top_ps']}", lambda side, x: side.apply_top_p(x, p["top_ps"]), doubt),
                 ("apply_min_p", f"min_ps={p['min_ps']}", lambda side, x: side.apply_min_p(x, p["min_ps"]), None)]
        for name, args, fn, doubt_of in calls:
            twins = Twins(reference, student, tol=PROCESSOR_TOL, hint=hint(f"6a: {name}"))
            call = (lambda side, x, fn=fn: settle(fn(side, x), doubt_of)) if doubt_of is not None else fn
            twins.call(f"{name}(logits={shown(logits)}, {args})", call, inputs=(logits,), again=True)

    explore(processor_scenarios(), check, seed=seed, examples=60, name="processors", edges=PROCESSOR_EDGES)


# Tried first at every seed (issue 41): a row of one token with every processor at its far edge (temperature 1e-6,
# top_p 1e-9, min_p 1, penalty 50 of an empty history); a row of four tied logits whose top-p 0.5 boundary falls exactly
# between two of them, top_k V + 1, min_p 0, beside a row with -inf and +-30, temperature 0 and 1e4, top_k V, a history
# repeating id 0.
_INF = float("inf")
PROCESSOR_EDGES = [
    (torch.tensor([[0.5]]), {"temperatures": [1e-6], "top_ks": [0], "top_ps": [1e-9], "min_ps": [1.0], "histories": [[]], "penalties": [50.0]}),
    (torch.tensor([[1.0, 1.0, 1.0, 1.0], [-_INF, 30.0, -30.0, 0.0]]),
     {"temperatures": [1e4, 0.0], "top_ks": [5, 4], "top_ps": [0.5, 0.999], "min_ps": [0.0, 1.0], "histories": [[0, 0, 3], []],
      "penalties": [0.5, 2.0]}),
]


@st.composite
def sampler_scenarios(draw):
    """Tied logits in float32, float16, bfloat16 or float64, a SamplingParams per row (greedy rows often, every
    processor at its edges), histories (None when no row has a penalty, half the time), the draw (None or one of
    the two), and a seed per row."""
    logits = draw(tied_logits(rows=(1, 4), vocab=(1, 12)))
    rows, vocab = logits.shape
    params = [SamplingParams(temperature=draw(st.one_of(st.just(0.0), st.sampled_from(TEMPERATURES))), top_k=draw(top_ks(vocab)),
                             top_p=draw(st.sampled_from(TOP_PS)), min_p=draw(st.sampled_from(MIN_PS)),
                             repetition_penalty=draw(st.sampled_from([1.0, 1.0, *PENALTIES])), seed=draw(st.integers(0, 2**31)))
              for _ in range(rows)]
    histories = draw(histories_of(rows, vocab))
    if all(q.repetition_penalty == 1 for q in params) and draw(st.booleans()):
        histories = None
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    return logits.to(dtype), params, histories, draw(st.sampled_from([None, "draw_multinomial", "draw_exponential_race"]))


def before_top_p(logits, params, histories):
    """The reference's logits as top-p receives them (penalty, temperature, top-k applied): where its rounding lies."""
    x = logits.float()
    if any(q.repetition_penalty != 1 for q in params):
        x = reference.apply_repetition_penalty(x, histories, [q.repetition_penalty for q in params])
    return reference.apply_top_k(reference.apply_temperature(x, [q.temperature for q in params]), [q.top_k for q in params])


def token_reading(token, support, sure):
    """A drawn token as the contract fixes it: a Python int the filters keep; the token itself where only one is kept."""
    if type(token) is not int:
        return f"{type_name(token)} {token!r}, not a Python int"
    if not 0 <= token < len(support) or not support[token]:
        return f"token {token}, which has probability 0 there"
    return token if sure else "a token of non-zero probability"


def observe_sample(side, logits, params, histories, draw_name, support):
    """sample() as its contract fixes it: a list of Python ints; a greedy row's token (the first argmax of its
    filtered logits) and its generator untouched; a sampled row's token one the filters keep (THE token where only
    one is kept); the same seeds again the same tokens; each row alone the token it drew in the batch."""
    draw = {} if draw_name is None else {"draw": getattr(side, draw_name)}

    def run(rows):
        generators = [torch.Generator().manual_seed(params[i].seed) for i in rows]
        states = [g.get_state() for g in generators]
        tokens = side.sample(logits[rows], [params[i] for i in rows], generators,
                             None if histories is None else [histories[i] for i in rows], **draw)
        return tokens, [torch.equal(g.get_state(), s) for g, s in zip(generators, states)]
    every = list(range(len(params)))
    tokens, untouched = run(every)
    if not isinstance(tokens, list) or len(tokens) != len(params):
        return {"returned": f"{type_name(tokens)} of {len(tokens) if hasattr(tokens, '__len__') else '?'} tokens"}
    sure = [q.greedy or int(s.sum()) == 1 for q, s in zip(params, support)]
    return {"returned": "list",
            "tokens": [token_reading(t, s, k) for t, s, k in zip(tokens, support, sure)],
            "greedy rows' generators untouched": [u for u, q in zip(untouched, params) if q.greedy],
            "the same seeds again: the same tokens": run(every)[0] == tokens,
            "each row alone: the token it drew in the batch": [run([i])[0] for i in every] == [[t] for t in tokens]}


def observe_draw(side, probs, draw_name, seeds, shared):
    """draw_multinomial / draw_exponential_race as their contract fixes them: a list of B Python ints of non-zero
    probability (THE token of a one-hot row); the same seeds again the same tokens; with a generator per row, each
    row alone the token it drew in the batch (with one generator shared by every row, it serves them in turn)."""
    draw = getattr(side, draw_name)

    def run(rows):
        one = torch.Generator().manual_seed(seeds[0])
        generators = [one if shared else torch.Generator().manual_seed(seeds[i]) for i in rows]
        return draw(probs[rows], generators)
    every = list(range(len(probs)))
    tokens = run(every)
    if not isinstance(tokens, list) or len(tokens) != len(probs):
        return {"returned": f"{type_name(tokens)} of {len(tokens) if hasattr(tokens, '__len__') else '?'} tokens"}
    support = probs > 0
    seen = {"returned": "list", "tokens": [token_reading(t, s, int(s.sum()) == 1) for t, s in zip(tokens, support)],
            "the same seeds again: the same tokens": run(every) == tokens}
    if not shared:
        seen["each row alone: the token it drew in the batch"] = [run([i]) for i in every] == [[t] for t in tokens]
    return seen


def test_differential_6b_sampler(student, seed):
    """filter_logits, sample and both draws on generated batches against the reference: logits of every float dtype
    (float32 back), greedy and sampled rows mixed, every processor at its edges, histories None where allowed.
    Compared: filter_logits' logits (a token in doubt at the top-p boundary, or of probability 0, read alike);
    sample's greedy tokens, its sampled tokens' support (the draw itself is yours to design), greedy generators
    untouched, seeded repeats and rows alone; the arguments unchanged."""
    def check(scenario):
        logits, params, histories, draw_name = scenario
        doubt = top_p_doubt(before_top_p(logits, params, histories), [q.top_p for q in params])
        support = torch.isfinite(settle(reference.filter_logits(logits, params, histories))) | doubt
        args = f"logits={shown(logits)}, params={params}, histories={histories}"
        twins = Twins(reference, student, tol=PROCESSOR_TOL, hint=hint("6b: filter_logits"))
        twins.call(f"filter_logits({args})", lambda side, x, h: settle(side.filter_logits(x, params, h), doubt),
                   inputs=(logits, histories), again=True)
        twins = Twins(reference, student, hint=hint("6b: sample"))
        twins.call(f"sample({args}, generators seeded by each row's seed, draw={draw_name})",
                   lambda side, x, h: observe_sample(side, x, params, h, draw_name, support), inputs=(logits, histories))
        probs = logits.float().softmax(dim=1)
        for name in ("draw_multinomial", "draw_exponential_race"):
            twins = Twins(reference, student, hint=hint("6b: draw_multinomial and draw_exponential_race"))
            for shared in (False, True):
                twins.call(f"{name}(probs={probs.tolist()}, {'one generator shared by every row' if shared else 'a generator per row'})",
                           lambda side, pr: observe_draw(side, pr, name, [q.seed for q in params], shared), inputs=(probs,))

    explore(sampler_scenarios(), check, seed=seed, examples=40, name="sampler", edges=SAMPLER_EDGES)


# Tried first at every seed (issue 41): one row of one token, greedy, histories None; a greedy row over a tie beside a
# sampled row whose top_k 1 falls on a tie, with a penalty on a repeated id, seed 0; a bfloat16 row of four ties cut by
# top_p 0.5 beside one where min_p 1 keeps the largest only.
SAMPLER_EDGES = [
    (torch.tensor([[0.0]]), [SamplingParams(temperature=0.0, seed=0)], None, None),
    (torch.tensor([[1.0, 1.0, -_INF], [2.0, 2.0, 0.0]]),
     [SamplingParams(temperature=0.0, seed=1), SamplingParams(temperature=1.0, top_k=1, repetition_penalty=1.3, seed=0)],
     [[0], [2, 2]], "draw_exponential_race"),
    (torch.tensor([[1.0, 1.0, 1.0, 1.0], [30.0, 2.0, 1.0, -30.0]], dtype=torch.bfloat16),
     [SamplingParams(temperature=1.0, top_p=0.5, seed=2**31), SamplingParams(temperature=2.0, min_p=1.0, seed=0)], None, "draw_multinomial"),
]


@st.composite
def beam_scenarios(draw):
    """A small random model, a prompt, num_beams 1 to 4, max_new_tokens 1 to 5, or one error (num_beams 0 or -1, an
    empty prompt, max_new_tokens 0 or past the context); length_penalty 1 and others, an EOS: the default, never
    produced (-1), or the k-th token of the greedy output (resolved by the check: hypotheses then end early)."""
    config = draw(small_config(max_layers=2, n_positions=(16,)))
    prompt = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=1, max_size=6))
    num_beams, max_new = draw(st.sampled_from([1, 1, 2, 3, 4])), draw(st.integers(1, 5))
    bad = draw(st.sampled_from([None] * 5 + ["num_beams", "prompt", "max_new_tokens"]))  # one request in about three: an error
    if bad == "num_beams":
        num_beams = draw(st.sampled_from([0, -1]))
    elif bad == "prompt":
        prompt = []
    elif bad == "max_new_tokens":
        max_new = draw(st.sampled_from([0, config.n_positions - len(prompt) + 1]))
    return (config, prompt, num_beams, max_new, draw(st.sampled_from([1.0, 0.0, 0.5, 2.0, -0.5])),
            draw(st.one_of(st.just("default"), st.just(-1), st.integers(0, 3))))


@functools.lru_cache(maxsize=8)
def float64_model(fields):
    """A float64 copy of a small random model: candidates whose totals differ by float32 rounding alone (a batch of
    beams and one beam at a time round differently) are rarer by far, so designs agree on which of them to keep."""
    return copy.deepcopy(small_model(GPTConfig(*fields))).double()


def test_differential_6c_beam_search(student, seed):
    """beam_search on small random models (in float64) against the reference: num_beams 1 (greedy, its score with the length
    penalty too) to 4, non-default length penalties, hypotheses ending in EOS, errors (num_beams < 1, an empty
    prompt, max_new_tokens 0 or past the context) of the reference's class. Compared: every Hypothesis in order
    (tokens exactly, score a float within 1e-4), at most one prefill then num_beams tokens a step through the
    model, the prompt unchanged, the same result twice."""
    from solutions.ex2_kv_cache import generate as greedy

    def check(scenario):
        config, prompt, num_beams, max_new, length_penalty, eos = scenario
        m = float64_model(dataclasses.astuple(config))
        if eos == "default":
            eos = EOS_TOKEN_ID
        elif eos >= 0:  # the eos-th greedy token: the model does produce it
            produced = greedy(m, prompt, max_new, eos_token_id=-1) if prompt and 1 <= max_new <= config.n_positions - len(prompt) else []
            eos = produced[min(eos, len(produced) - 1)] if produced else -1

        def run(side, p):
            with count_model_work(m) as work:
                found = side.beam_search(m, p, num_beams, max_new, length_penalty=length_penalty, eos_token_id=eos)
            return {"hypotheses": found, "at most one prefill, then num_beams tokens a step":
                    work.tokens <= len(p) + max(num_beams, 0) * (max_new - 1)}
        twins = Twins(reference, student, tol=Tolerance(rtol=1e-4, atol=1e-4), hint=hint("6c: beam_search"))
        twins.call(f"beam_search(model with {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, context "
                   f"{config.n_positions}; prompt={prompt}, num_beams={num_beams}, max_new_tokens={max_new}, "
                   f"length_penalty={length_penalty}, eos_token_id={eos})", run, inputs=(prompt,), again=True)

    explore(beam_scenarios(), check, seed=seed, examples=25, name="beam search", edges=BEAM_EDGES)


# Tried first at every seed (issue 41): four beams on a one-token prompt (id 0) whose first greedy token is the EOS
# (hypotheses end at once), length_penalty 0; a prompt two short of the context, two tokens; refused: num_beams 0,
# max_new_tokens one past the context.
_CONTEXT_16 = GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2)
BEAM_EDGES = [
    (_CONTEXT_16, [0], 4, 5, 0.0, 0),
    (_CONTEXT_16, list(range(100, 114)), 2, 2, 1.0, -1),
    (_CONTEXT_16, [5], 0, 1, 1.0, "default"),
    (_CONTEXT_16, [5] * 6, 2, 11, 1.0, -1),
]


PIECES = ["Hello", " world", " wor", "ld", "!", " lol", " lo", "l", "\n", "\n\n", " 🦊", " fox", "é", "ab", "a", "b", " the", "."]


@st.composite
def stop_scenarios(draw, tokenizer):
    """Tokens of 1 to 8 pieces (a fox emoji spread over byte-level tokens among them; an EOS inside, sometimes),
    and two StopCheckers: stop strings cut out of the text (across tokens, overlapping each other), a token's whole
    text, one never found; stop token ids EOS, none, or EOS and "\\n"; max_new_tokens None, at the edges, or the very
    token that completes a stop string."""
    tokens = [t for piece in draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=8)) for t in tokenizer.encode(piece)]
    if draw(st.booleans()):
        tokens.insert(draw(st.integers(0, len(tokens))), EOS_TOKEN_ID)
    text = tokenizer.decode([t for t in tokens if t != EOS_TOKEN_ID])
    candidates = [text[a:a + n] for a in range(len(text)) for n in range(1, 7)]
    candidates += [tokenizer.decode([t]) for t in tokens if t != EOS_TOKEN_ID] + ["zz\x00"]
    candidates = sorted({c for c in candidates if c and "\ufffd" not in c})

    def checker():
        stops = draw(st.lists(st.sampled_from(candidates), max_size=3))
        stop_ids = draw(st.sampled_from([(EOS_TOKEN_ID,), (), (EOS_TOKEN_ID, NEWLINE)]))
        texts = [tokenizer.decode([t for t in tokens[:k] if t not in stop_ids]) for k in range(1, len(tokens) + 1)]
        completes = [k for k, t in enumerate(texts, 1) if any(s in t for s in stops)][:1]  # the token that completes a stop string
        max_new = draw(st.one_of(st.none(), st.sampled_from(completes or [1]), around(1, len(tokens), low=1, high=len(tokens) + 1)))
        return stops, stop_ids, max_new
    return tokens, checker(), checker()


def observe_checker(checker):
    """What StopChecker promises after every add(): the tokens recorded, the text, the finish reason, finished."""
    return {"token_ids": list(checker.token_ids) if isinstance(checker.token_ids, list) else checker.token_ids,
            "text": checker.text, "finish_reason": checker.finish_reason, "finished": checker.finished}


def test_differential_6d_stop_checker(student, tokenizer, seed):
    """Two StopCheckers fed the same generated tokens, interleaved, against the reference's, observed after EVERY
    add(): the piece returned (what is safe to stream), token_ids, text, finish_reason and finished. Stop strings
    across tokens, overlapping ones, a token's whole text, a stop token, max_new_tokens met on the token that
    completes a stop string; add() after finishing: the reference's RuntimeError, the state unchanged."""
    def check(scenario):
        tokens, *configs = scenario
        mods = Twins(reference, student, hint=hint("6d: StopChecker.add and _safe_length"))
        checkers = []
        for stops, stop_ids, max_new in configs:
            checkers.append(mods.call(f"checker {len(checkers) + 1} = StopChecker(tokenizer, stop={stops!r}, stop_token_ids="
                                      f"{list(stop_ids)}, max_new_tokens={max_new})",
                                      lambda m, s=stops, i=stop_ids, n=max_new: m.StopChecker(tokenizer, s, i, n),
                                      returns="type", observe=observe_checker))
        for token in tokens:
            for n, checker in enumerate(checkers, 1):
                if not checker.reference.finished:
                    checker.call(f"checker {n}.add({token})  # {tokenizer.decode([token])!r}", lambda c: c.add(token))
        for n, checker in enumerate(checkers, 1):
            if checker.reference.finished:  # the caller's bug: the reference's error, nothing changed
                checker.call(f"checker {n}.add({tokens[0]}) after it finished", lambda c: c.add(tokens[0]))

    explore(stop_scenarios(tokenizer), check, seed=seed, examples=40, name="stop checker", edges=stop_edges(tokenizer))


def stop_edges(tokenizer):
    """Tried first at every seed (issue 41): a stop string completed by the last of the fox emoji's byte tokens and
    one across two tokens, no stop ids, max_new_tokens None, beside the EOS and "\\n" as stop ids with max_new_tokens exactly the
    tokens; id 0 ("!") whose whole text is a stop string, completed by the very token max_new_tokens 1 allows, beside a
    stop string never found and max_new_tokens one past the tokens."""
    fox = tokenizer.encode("Hello") + tokenizer.encode(" 🦊") + [EOS_TOKEN_ID] + tokenizer.encode("!\n")
    bang = [0] + tokenizer.encode("\n\n") + tokenizer.encode(" lol")
    return [(fox, (["o 🦊", "llo"], (), None), ([], (EOS_TOKEN_ID, NEWLINE), len(fox))),
            (bang, (["!"], (EOS_TOKEN_ID,), 1), (["zz\x00"], (), len(bang) + 1))]


@st.composite
def generate_scenarios(draw):
    """A small random model, a prompt, max_new_tokens up to the context, a deterministic sampling (greedy, greedy
    with a penalty, top_k 1 sampled with a seed), a stop string cut from the greedy text (at fractions drawn here),
    and stop token ids (EOS, none, or the k-th greedy token)."""
    config = draw(small_config(max_layers=2, n_positions=(16,)))
    prompt = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=1, max_size=6))
    max_new = draw(around(1, config.n_positions - len(prompt), low=1, high=min(10, config.n_positions - len(prompt))))
    sampling = draw(st.sampled_from([GREEDY, SamplingParams(temperature=0.0, repetition_penalty=1.5),
                                     SamplingParams(temperature=0.7, top_k=1, seed=3),
                                     SamplingParams(temperature=1.2, top_k=1, repetition_penalty=1.3, seed=None)]))
    stop = draw(st.one_of(st.none(), st.tuples(st.floats(0, 1), st.integers(1, 4))))
    return config, prompt, max_new, sampling, stop, draw(st.one_of(st.just("default"), st.just("none"), st.integers(0, 9)))


def test_differential_6d_generate(student, tokenizer, seed):
    """generate (given, with your sample and StopChecker inside) on small random models: the Completion (token_ids,
    text, finish_reason) and the pieces streamed to on_text equal the reference's, for deterministic samplings."""
    def check(scenario):
        config, prompt, max_new, sampling, stop, stop_ids = scenario
        m = small_model(config)
        plain = reference.generate(m, tokenizer, prompt, max_new, sampling, stop_token_ids=())
        stops = ()
        if stop is not None and plain.text.strip("\ufffd"):
            start = int(stop[0] * (len(plain.text) - 1))
            stops = tuple(s for s in [plain.text[start:start + stop[1]]] if s and "\ufffd" not in s)
        if stop_ids in ("default", "none"):
            stop_ids = (EOS_TOKEN_ID,) if stop_ids == "default" else ()
        else:  # a token the model does produce
            stop_ids = (plain.token_ids[min(stop_ids, len(plain.token_ids) - 1)],)

        def run(side, p):
            pieces = []
            done = side.generate(m, tokenizer, p, max_new, sampling, stop=stops, stop_token_ids=stop_ids, on_text=pieces.append)
            return {"completion": done, "pieces streamed to on_text": pieces}
        twins = Twins(reference, student, hint=hint("6d: StopChecker.add and _safe_length; 6b: sample"))
        twins.call(f"generate(model with {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}; tokenizer, "
                   f"prompt={prompt}, max_new_tokens={max_new}, sampling={sampling}, stop={stops!r}, stop_token_ids={list(stop_ids)})",
                   run, inputs=(prompt,), again=True)

    explore(generate_scenarios(), check, seed=seed, examples=10, name="generate", edges=GENERATE_EDGES)


# Tried first at every seed (issue 41): a one-token prompt (id 0) filling the context to its last position, greedy, no
# stop at all; one new token sampled with top_k 1, a stop string of the text's first character, the first token as stop id.
GENERATE_EDGES = [
    (_CONTEXT_16, [0], 15, GREEDY, None, "none"),
    (_CONTEXT_16, [5, 6, 7, 8, 9, 10], 1, SamplingParams(temperature=0.7, top_k=1, seed=3), (0.0, 1), 0),
]


# ----------------------------------------------------------------------------------------------
# Timing

@pytest.mark.timing
def test_6b_sampler_speed_against_the_reference(student, real_logits, device):
    logits = real_logits.repeat(2, 1)
    params = MIXED * 2
    limit = 3.0 if device == "cpu" else 2.0

    histories = [[11, 198, 464 + i] for i in range(len(params))]

    def run(module):
        return lambda: module.sample(logits, params, [torch.Generator().manual_seed(i) for i in range(len(params))], histories)

    timing = paired_timing(run(student), run(reference), repeats=7, device=device)
    assert timing.ratio < limit, f"your sample() takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n{timing.report('yours', 'reference')}"
