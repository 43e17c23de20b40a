"""Checker for exercise 7, speculative decoding: pytest exercises/test_ex7_speculative.py

Parts are graded on their own (-k 7a, -k 7b, ...). Greedy speculative decoding must return exactly the
target's greedy tokens; rejection sampling is checked on hand-built distributions against the
distribution it must produce (chi-square and binomial tests at significance 1e-5 each: a correct
implementation fails this checker less than once in 10,000 runs); scripted drafts that disagree where
we choose check the acceptance rule and the counters; the target's cache is compared after each round.
The differential checks (test_7*_differential_*) run generated scenarios (ties, exact zeros, k at the request's edge,
drafts of other sizes, two decoders in turn) on the reference and on yours and compare what the contract promises
after every call.
"""

import contextlib
import copy
import functools
import math
import random
import types

import pytest
import torch
from hypothesis import strategies as st

import gpt
import solutions.ex2_kv_cache as kv
import solutions.ex7_speculative as reference
from workshop.grading.device_audit import on_device
from workshop.grading.harness import (
    TIE_EPSILON,
    audited_first,
    chi_square_p_value,
    compare_tokens,
    count_model_work,
    describe_token_mismatch,
    implementation,
    paired_timing,
    refused,
)
from workshop.grading.differential import GreedyTokens, Tolerance, Twins, explore, read, record
from workshop.grading.scenarios import around, prompts, small_config, small_model, tied_logits, token_ids
from workshop.grading.wording import plural
from workshop.serving.sampling import GREEDY, SamplingParams, filter_logits, make_generator
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex7.md"
SIGNIFICANCE = 1e-5  # per statistical check; the checker has 6 of them, so a correct implementation fails < 1e-4
Z_LIMIT = 4.42  # two-sided normal quantile for 1e-5
# Each public name of the stub -> the differential check that runs it against the reference (tests/test_differential.py)
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "7d": ["rollback"],  # first: the stub, its hints and its contract start with it (the draft's propose rolls its cache back)
    "7a": ["DraftModel.propose"],
    "7b": ["verify", "accept_greedy"],
    "7c": ["accept_sampled"],
    "7e": ["SpeculativeStats.acceptance_rate", "SpeculativeStats.tokens_per_target_forward", "SpeculativeDecoder.step"],
    "7f": ["jacobi_generate"],
}
DIFFERENTIAL_API = {
    "rollback": "test_7d_differential_rollback",
    "DraftModel": "test_7a_differential_propose", "DraftModel.propose": "test_7a_differential_propose",
    "verify": "test_7b_differential_verify", "accept_greedy": "test_7b_differential_verify", "extend": "test_7b_differential_verify",
    "accept_sampled": "test_7c_differential_accept_sampled", "probabilities": "test_7c_differential_accept_sampled",
    "SpeculativeDecoder": "test_7e_differential_decoder", "SpeculativeDecoder.step": "test_7e_differential_decoder",
    "SpeculativeStats": "test_7e_differential_decoder", "SpeculativeStats.acceptance_rate": "test_7e_differential_decoder",
    "SpeculativeStats.tokens_per_target_forward": "test_7e_differential_decoder",
    "speculative_generate": "test_7e_differential_decoder",
    "shortlist": "test_7e_differential_decoder", "ShortlistHead": "test_7e_differential_decoder",
    "ShortlistHead.forward": "test_7e_differential_decoder",
    "jacobi_generate": "test_7f_differential_jacobi",
}


@pytest.fixture(scope="module")
def student():
    return implementation("ex7_speculative")


@pytest.fixture(scope="module")
def cases(model, seed):
    """Seeded prompts of 1 to 40 tokens, each with its own number of new tokens; the last one a single token,
    the shortest prompt there is (code that looks back two tokens breaks there)."""
    rng = random.Random(seed + 7)
    prompts = sample_prompts(model, 4, 1, 40, seed + 7)
    prompts[-1] = prompts[-1][:1]
    return [(prompt, rng.randint(24, 48)) for prompt in prompts]


@functools.cache
def greedy(model, prompt, n):
    """The target's (or draft's) own greedy tokens, exercise 2's reference, EOS ignored."""
    return kv.generate(model, list(prompt), n, eos_token_id=-1)


def full_logits(model, tokens):
    """Logits [len(tokens), vocab] of a plain forward over all tokens (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([tokens], device=model.device), torch.arange(len(tokens), device=model.device)[None])[0].float()


# ----------------------------------------------------------------------------------------------
# 7d: rolling a cache back

def test_7d_rollback_keeps_exactly_the_prefix(student, seed):
    g = torch.Generator().manual_seed(seed)
    hint = f"(see {HINTS}, 7d)"
    cache = kv.KVCache(n_layer=3)
    student.rollback(cache, 0)  # an empty cache: nothing to forget, no error
    assert len(cache) == 0, f"rolling an empty cache back to 0 must leave it empty {hint}."
    full = [torch.randn(2, 4, 30, 8, generator=g) for _ in range(3)]
    for layer in range(3):
        cache.update(layer, full[layer], -full[layer])
    for length in (30, 23, 23, 9, 1):
        student.rollback(cache, length)
        assert len(cache) == length, f"after rollback(cache, {length}), len(cache) is {len(cache)} {hint}."
        for layer in range(3):
            assert torch.equal(cache.keys[layer], full[layer][:, :, :length]) and torch.equal(cache.values[layer], -full[layer][:, :, :length]), (
                f"after rollback(cache, {length}), layer {layer} does not hold exactly its first {length} positions {hint}.")
    new = torch.randn(2, 4, 3, 8, generator=g)
    for layer in range(3):
        keys, _ = cache.update(layer, new, new)
        assert torch.equal(keys, torch.cat([full[layer][:, :, :1], new], dim=2)), f"after a rollback, update() must append right after the kept positions {hint}."
    for bad in (len(cache) + 1, -1):
        with refused(ValueError, f"rollback(cache, {bad}) on a cache of {plural(len(cache), 'position')}"):
            student.rollback(cache, bad)


# ----------------------------------------------------------------------------------------------
# 7a: drafting

def test_7a_draft_proposes_its_own_greedy_tokens_without_rerunning_the_prompt(student, draft_model, tokenizer, cases, seed):
    """Rounds as the decoding loop makes them: each context is the last one plus some of the drafted
    tokens and one other token. The draft's tokens must be its own greedy continuation, its q rows
    one-hot on them, and each call may only run what its cache does not hold yet, plus the k steps."""
    rng = random.Random(seed + 71)
    hint = f"(see {HINTS}, 7a)"
    for prompt, _ in cases[:3]:
        drafter, context, known = student.DraftModel(draft_model), list(prompt), 0
        for _ in range(5):
            k = rng.randint(1, 6)
            with count_model_work(draft_model) as work:
                tokens, probs = drafter.propose(context, k)
            expected = greedy(draft_model, tuple(context), k)
            problem = compare_tokens(tokens, expected, draft_model, context, tokenizer)
            assert problem is None, (f"propose(context of {plural(len(context), 'token')}, k={k}) is not the draft's greedy continuation: stale "
                                     f"keys and values of rejected tokens left in the draft's cache change it {hint}.\n{problem}")
            assert tuple(probs.shape) == (k, draft_model.config.vocab_size), f"probs must be [k, vocab] = [{k}, {draft_model.config.vocab_size}], got {tuple(probs.shape)} {hint}."
            assert torch.allclose(probs[torch.arange(k), tokens], torch.ones(k)), f"greedy q rows are one-hot on the drafted tokens {hint}."
            allowed = len(context) - known + k + 1
            assert k <= work.forward_passes <= k + 1 and work.tokens <= allowed, (
                f"propose(k={k}) ran {work.forward_passes} forwards over {work.tokens} tokens; the cache already held {known} of the "
                f"{len(context)} context tokens, so at most {allowed} tokens in k or k + 1 forwards: keep the agreeing prefix in "
                f"the cache, do not run the prompt again {hint}.")
            assert drafter.forwards >= work.forward_passes, f"DraftModel.forwards must count every forward of the draft {hint}."
            accepted = rng.randint(0, k)  # what a verification might have kept, then the target's own token
            other = (tokens[accepted] + 1 + rng.randrange(100)) % draft_model.config.vocab_size if accepted < k else rng.randrange(50000)
            known = len(context) + accepted
            context = context + tokens[:accepted] + [other]


@pytest.mark.slow
def test_7a_draft_samples_from_its_filtered_distribution(student, draft_model, seed):
    """Sampled drafting: row i of probs is the draft's distribution after context + tokens[:i] under
    exercise 6's processors, and the first token follows row 0 (chi-square, significance 1e-5)."""
    hint = f"(see {HINTS}, 7a)"
    sampling = SamplingParams(temperature=0.9, top_k=8)
    context = sample_prompts(draft_model, 1, 5, 20, seed + 72)[0]
    generator = torch.Generator().manual_seed(seed)
    drafter = student.DraftModel(draft_model)
    tokens, probs = drafter.propose(context, 3, sampling, generator)
    logits = full_logits(draft_model, context + tokens)[len(context) - 1:]
    expected = filter_logits(logits, [sampling] * len(logits)).softmax(-1).cpu()
    assert torch.allclose(probs, expected[:3], atol=1e-5), (
        f"probs rows must be the draft's distributions under {sampling} (exercise 6's filter, then softmax), after context + "
        f"tokens[:i]: max difference {(probs - expected[:3]).abs().max():.2e} {hint}.")
    assert all(probs[i, t] > 0 for i, t in enumerate(tokens)), f"a drafted token has probability 0 in its own row {hint}."
    draws = 1000
    counts = torch.zeros(draft_model.config.vocab_size)
    for _ in audited_first(draws):
        tokens, _ = drafter.propose(context, 1, sampling, generator)
        counts[tokens[0]] += 1
    allowed = expected[0] > 0
    assert counts[~allowed].sum() == 0, f"the draft drew tokens that top-k removed {hint}."
    p, stat = chi_square_p_value(counts[allowed], expected[0][allowed])
    assert p > SIGNIFICANCE, (f"the first drafted token does not follow q (chi-square {stat:.1f}, p = {p:.2e} < {SIGNIFICANCE}): draw it "
                              f"from q with the generator given {hint}.\n  counts {counts[allowed].long().tolist()}\n  expected "
                              f"{[round(x) for x in (expected[0][allowed] * draws).tolist()]}")


def test_7a_sampled_draft_penalises_its_history_and_draws_with_its_generator(student, draft_model, seed):
    """With a repetition penalty, row i of q is the draft's distribution penalised with context + tokens[:i] (the
    drafts before it count as history); and the generator given is the only source of randomness: the same
    generator state gives the same tokens, whatever torch's global random state."""
    hint = f"(see {HINTS}, 7a)"
    sampling = SamplingParams(temperature=1.2, top_k=12, repetition_penalty=3.0)
    context = sample_prompts(draft_model, 1, 5, 20, seed + 78)[0]
    flat = SamplingParams(temperature=2.0, top_k=50)  # flat rows: the draw decides every token
    start = torch.Generator().manual_seed(seed).get_state()
    runs = []
    for global_seed in (seed, seed + 1):
        torch.manual_seed(global_seed)  # another global random state: it must not matter
        generator = torch.Generator()
        generator.set_state(start)
        drafter = student.DraftModel(draft_model)
        runs.append([drafter.propose(context, 6, flat, generator)[0] for _ in range(3)])
    assert runs[0] == runs[1], (f"propose() with generators in the same state gave {runs[0]}, then {runs[1]} (torch's global "
                                f"seed changed in between): draw with the generator given, the only source of randomness {hint}.")
    tokens, probs = student.DraftModel(draft_model).propose(context, 4, sampling, torch.Generator().manual_seed(seed))
    logits = full_logits(draft_model, context + tokens)[len(context) - 1:len(context) + 3]
    expected = filter_logits(logits, [sampling] * 4, [context + tokens[:i] for i in range(4)]).softmax(-1).cpu()
    error = (probs - expected).abs().max().item()
    assert error < 1e-5, (
        f"probs rows must be the draft's distributions under {sampling}, row i penalised with context + tokens[:i] as its "
        f"history (the drafts before it included): max difference {error:.2e} {hint}.")


# ----------------------------------------------------------------------------------------------
# 7b: verification, greedy

def test_7b_verify_scores_all_positions_in_one_forward(student, model, seed):
    """verify() returns the k + 1 rows a full forward gives at those positions, in one forward that runs
    only what the cache lacks: the first call the prompt and the drafts, later ones after a rollback."""
    rng, hint = random.Random(seed + 73), f"(see {HINTS}, 7b)"
    context = sample_prompts(model, 1, 5, 30, seed + 73)[0]
    cache = kv.KVCache(model.config.n_layer)
    for round_ in range(4):
        k = rng.randint(1, 8)
        drafted = [rng.randrange(model.config.vocab_size) for _ in range(k)]
        uncached = len(context) - len(cache)
        with count_model_work(model) as work:
            logits = student.verify(model, cache, context, drafted)
        assert (work.forward_passes, work.tokens) == (1, uncached + k), (
            f"round {round_}: verify() must run ONE forward over the {uncached} uncached context token(s) and the {k} drafts; it ran "
            f"{work.forward_passes} forwards over {work.tokens} tokens {hint}.")
        expected = full_logits(model, context + drafted)[len(context) - 1:]
        assert tuple(logits.shape) == tuple(expected.shape), f"verify() with k={k} must return [k + 1, vocab] = {tuple(expected.shape)}, got {tuple(logits.shape)} {hint}."
        error = (logits.float() - expected).abs().max().item()
        assert error < 1e-4, (f"round {round_}: verify()'s logits differ from a full forward's by {error:.2e} with {len(cache) - k - uncached} "
                              f"positions cached: the k + 1 queries come after the cached keys, so the causal mask is lower-right "
                              f"aligned (is_causal=True is upper-left) {hint}.")
        assert len(cache) == len(context) + k, f"after verify(), the cache should hold the context and the {k} drafts ({len(context) + k}), not {len(cache)} {hint}."
        accepted = rng.randint(0, k)
        context = context + drafted[:accepted] + [int(expected[accepted].argmax())]
        reference.rollback(cache, len(context) - 1)


def test_7b_verify_with_no_drafts_scores_one_position(student, model, seed):
    """k = 0 (a round that may return one token): one forward over the uncached context tokens, one row back, the
    target's next-token logits after the whole context."""
    hint = f"(see {HINTS}, 7b)"
    context = sample_prompts(model, 1, 6, 20, seed + 74)[0]
    cache = kv.KVCache(model.config.n_layer)
    for known in (0, len(context) - 1):
        reference.rollback(cache, min(known, len(cache)))
        with count_model_work(model) as work:
            logits = student.verify(model, cache, context, [])
        expected = full_logits(model, context)[-1:]
        assert tuple(logits.shape) == tuple(expected.shape), (
            f"verify() with no drafts and {known} of {len(context)} context tokens cached returned {tuple(logits.shape)}; "
            f"expected [1, vocab]: k + 1 = 1 row {hint}.")
        assert (work.forward_passes, work.tokens) == (1, len(context) - known), (
            f"verify() with no drafts ran {work.forward_passes} forwards over {work.tokens} tokens; one over the "
            f"{len(context) - known} uncached context tokens {hint}.")
        assert (logits.float() - expected).abs().max().item() < 1e-4 and len(cache) == len(context), (
            f"verify() with no drafts must return the target's logits after the whole context, and leave the context in the cache {hint}.")


@pytest.mark.parametrize("where", ["first", "middle", "last", "all agree", "no drafts"])
def test_7b_accept_greedy_keeps_the_agreeing_prefix_and_one_more(student, seed, where):
    rng = random.Random(f"{seed} {where}")
    k = 0 if where == "no drafts" else rng.randint(3, 8)
    vocab = 50
    logits = torch.randn(k + 1, vocab, generator=torch.Generator().manual_seed(seed))
    best = logits.argmax(dim=1).tolist()
    wrong_at = {"first": 0, "middle": k // 2, "last": k - 1}.get(where, k)
    drafted = [best[i] if i != wrong_at else (best[i] + 1) % vocab for i in range(k)]
    expected = drafted[:wrong_at] + [best[wrong_at]]
    got = student.accept_greedy(drafted, logits)
    assert got == expected, (f"accept_greedy with k={k}, the draft wrong at position {wrong_at if wrong_at < k else 'none'}: expected "
                             f"{expected} (the agreeing prefix, then the target's argmax at the first disagreement, or the bonus "
                             f"token when all agree), got {got} (see {HINTS}, 7b).")


# ----------------------------------------------------------------------------------------------
# 7c: rejection sampling, on hand-built distributions

P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04, 0.0, 0.0])  # the target
Q = torch.tensor([0.10, 0.10, 0.20, 0.20, 0.05, 0.05, 0.15, 0.15])  # the draft: too much mass on 2, 3, 6, 7
ALPHA = float(torch.minimum(P, Q).sum())  # the acceptance probability of one draft token
DRAWS = 40_000


@functools.cache
def rounds(accept_sampled, k, seed):
    """DRAWS rounds of accept_sampled with k drafts, each drawn from Q, the target P at every position."""
    drafts_generator, generator = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    drafts = torch.multinomial(Q, DRAWS * k, replacement=True, generator=drafts_generator).view(DRAWS, k).tolist()
    q, p = Q.expand(k, -1).contiguous(), P.expand(k + 1, -1).contiguous()
    return [accept_sampled(drafts[i], q, p, generator) for i in audited_first(DRAWS)]


@pytest.mark.slow
def test_7c_emitted_token_is_distributed_as_the_target(student, seed):
    """k = 1: the first token emitted follows P exactly (chi-square, significance 1e-5), whatever Q is."""
    out = rounds(student.accept_sampled, 1, seed)
    assert all(isinstance(o, list) and 1 <= len(o) <= 2 for o in out), f"with k=1 each round emits 1 or 2 tokens (see {HINTS}, 7c)."
    counts = torch.bincount(torch.tensor([o[0] for o in out]), minlength=len(P)).double()
    assert counts[P == 0].sum() == 0, (f"tokens the target gives probability 0 were emitted {int(counts[P == 0].sum())} times: a draft token "
                                       f"with p = 0 is never accepted, and the residual max(p - q, 0) is 0 there (see {HINTS}, 7c).")
    p_value, stat = chi_square_p_value(counts[P > 0], P[P > 0])
    assert p_value > SIGNIFICANCE, (
        f"the emitted token does not follow the target's p (chi-square {stat:.1f}, p = {p_value:.2e} < {SIGNIFICANCE}).\n"
        f"  counts   {counts[P > 0].long().tolist()}\n  expected {[round(x) for x in (P[P > 0] * DRAWS).tolist()]}\n"
        f"Accept with probability min(1, p/q); on a rejection draw from normalize(max(p - q, 0)), not from p (see {HINTS}, 7c).")


def test_7c_acceptance_rate_is_the_overlap_of_p_and_q(student, seed):
    """k = 1: a draft token is accepted with probability sum(min(p, q)) (binomial, significance 1e-5)."""
    out = rounds(student.accept_sampled, 1, seed)
    accepted = sum(len(o) == 2 for o in out)
    z = (accepted - DRAWS * ALPHA) / math.sqrt(DRAWS * ALPHA * (1 - ALPHA))
    assert abs(z) < Z_LIMIT, (f"{accepted} of {DRAWS} draft tokens were accepted ({accepted / DRAWS:.3f}); the acceptance probability is "
                              f"sum(min(p, q)) = {ALPHA:.3f} (z = {z:.1f}). Accept token x with probability min(1, p[x] / q[x]) "
                              f"(see {HINTS}, 7c).")


@pytest.mark.slow
def test_7c_accepted_run_lengths_and_bonus_token(student, seed):
    """k = 3, P and Q at every position: the number of accepted drafts m is truncated geometric,
    P(m = j) = alpha^j (1 - alpha) for j < 3 and alpha^3 for j = 3; m + 1 tokens come out (the bonus
    when all 3 are accepted), and the bonus token follows P (chi-square, significance 1e-5 each)."""
    k, hint = 3, f"(see {HINTS}, 7c)"
    out = rounds(student.accept_sampled, k, seed)
    assert all(isinstance(o, list) and 1 <= len(o) <= k + 1 for o in out), f"with k={k} each round emits 1 to {k + 1} tokens {hint}."
    lengths = torch.bincount(torch.tensor([len(o) - 1 for o in out]), minlength=k + 1).double()
    expected = torch.tensor([ALPHA ** j * (1 - ALPHA) for j in range(k)] + [ALPHA ** k], dtype=torch.float64)
    p_value, stat = chi_square_p_value(lengths, expected)
    assert p_value > SIGNIFICANCE, (
        f"how many of {k} drafts were accepted does not follow the truncated geometric law of alpha = {ALPHA:.3f} (chi-square {stat:.1f}, "
        f"p = {p_value:.2e}).\n  counts of m = 0..{k}: {lengths.long().tolist()}\n  expected {[round(x) for x in (expected * DRAWS).tolist()]}\n"
        f"Stop at the first rejection, and when all {k} are accepted add the bonus token drawn from the last row of p {hint}.")
    bonus = torch.bincount(torch.tensor([o[-1] for o in out if len(o) == k + 1]), minlength=len(P)).double()
    p_value, stat = chi_square_p_value(bonus[P > 0], P[P > 0])
    assert bonus[P == 0].sum() == 0 and p_value > SIGNIFICANCE, (
        f"the bonus token (all {k} accepted) does not follow the target's last row of p (chi-square {stat:.1f}, p = {p_value:.2e}) {hint}.")


def test_7c_certain_cases(student, seed):
    """Degenerate distributions decide without chance: p = q always accepts; p = 0 at the draft's token
    always rejects and replaces it from max(p - q, 0); one-hot p and q behave like greedy."""
    generator, hint = torch.Generator().manual_seed(seed), f"(see {HINTS}, 7c)"
    same = P.expand(3, -1).contiguous()
    for _ in range(200):
        out = student.accept_sampled([0, 1], same[:2], same, generator)
        assert out[:2] == [0, 1] and len(out) == 3, f"with p == q every draft token is accepted (min(1, p/q) = 1), got {out} {hint}."
    for _ in range(200):
        out = student.accept_sampled([6], Q[None], P.expand(2, -1).contiguous(), generator)
        assert len(out) == 1 and P[out[0]] > Q[out[0]], (
            f"a draft token the target gives probability 0 must be rejected and replaced by a token where p > q, got {out} {hint}.")
    one_hot = torch.eye(8)
    assert student.accept_sampled([3, 5], one_hot[[3, 5]], one_hot[[3, 4, 1]], generator) == [3, 4], (
        f"one-hot p and q: the first draft agrees, the second does not, so [3, 4] {hint}.")


def test_7c_no_drafts_and_the_generator_only(student, seed):
    """k = 0: one token drawn from p (the only row), never a token p gives 0; and every draw comes from the generator
    given: the same generator state gives the same output, whatever torch's global random state."""
    hint = f"(see {HINTS}, 7c)"
    p = torch.zeros(1, 8)
    p[0, 2] = p[0, 5] = 0.5
    generator = torch.Generator().manual_seed(seed)
    drawn = [tuple(student.accept_sampled([], torch.empty(0, 8), p, generator)) for _ in range(200)]
    assert set(drawn) == {(2,), (5,)}, (
        f"accept_sampled with no drafts and p = 0.5 on tokens 2 and 5 gave {sorted(set(drawn))[:6]} in 200 rounds: one token, "
        f"drawn from target_probs[0] (the bonus token of a round with k = 0) {hint}.")
    q, target = Q.expand(3, -1).contiguous(), P.expand(4, -1).contiguous()
    state = torch.Generator().manual_seed(seed + 1).get_state()
    outputs = []
    for global_seed in (seed, seed + 1):
        torch.manual_seed(global_seed)
        generator = torch.Generator()
        generator.set_state(state)
        outputs.append([student.accept_sampled(drafts, q, target, generator) for drafts in ([2, 3, 0], [6, 1, 1], [0, 0, 4]) * 20])
    assert outputs[0] == outputs[1], (
        f"accept_sampled with generators in the same state gave different outputs once torch's global seed changed: every "
        f"random draw (the acceptance tests, the residual, the bonus) comes from the generator given {hint}.")


# ----------------------------------------------------------------------------------------------
# 7e: the decoding loop and its statistics

def assert_stats_match(stats, got, target_work, draft_work, hint):
    assert stats.generated == len(got), f"stats.generated is {stats.generated}, but {plural(len(got), 'token')} came back {hint}."
    assert stats.target_forwards == target_work.forward_passes, (
        f"stats.target_forwards is {stats.target_forwards}, but the target ran {target_work.forward_passes} forwards {hint}.")
    if draft_work is not None:
        assert stats.draft_forwards == draft_work.forward_passes, (
            f"stats.draft_forwards is {stats.draft_forwards}, but the draft ran {draft_work.forward_passes} forwards {hint}.")
    assert 0 <= stats.accepted <= stats.drafted, f"stats: {stats.accepted} accepted of {stats.drafted} drafted {hint}."
    assert math.isclose(stats.acceptance_rate, stats.accepted / max(stats.drafted, 1)), f"acceptance_rate must be accepted / drafted {hint}."
    assert math.isclose(stats.tokens_per_target_forward, stats.generated / stats.target_forwards), (
        f"tokens_per_target_forward must be generated / target_forwards {hint}.")


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_7e_greedy_output_is_the_targets_own(student, model, draft_model, tokenizer, cases, k):
    """With the real draft: exactly the target's greedy tokens, fewer target forwards than tokens, and
    counters that match what ran."""
    hint = f"(see {HINTS}, 7e)"
    for prompt, n in cases:
        with count_model_work(model) as target_work, count_model_work(draft_model) as draft_work:
            got, stats = student.speculative_generate(model, draft_model, prompt, n, k=k, eos_token_id=-1)
        problem = compare_tokens(got, greedy(model, tuple(prompt), n), model, prompt, tokenizer)
        assert problem is None, f"speculative_generate(k={k}) must return the target's own greedy tokens {hint}.\n{problem}"
        assert_stats_match(stats, got, target_work, draft_work, hint)
        assert stats.target_forwards == stats.generated - stats.accepted, (
            f"every round returns its accepted drafts and one token of the target's: target forwards ({stats.target_forwards}) = "
            f"generated ({stats.generated}) - accepted ({stats.accepted}) {hint}.")
    assert stats.target_forwards < stats.generated, f"the draft agrees often, yet the target ran a forward per token {hint}."


def test_7e_stops_right_after_eos(student, model, draft_model, tokenizer, cases, seed):
    """A token the target produces is made the EOS: the output ends right after it, drafts after it are dropped."""
    rng, hint = random.Random(seed + 75), f"(see {HINTS}, 7e)"
    for prompt, n in cases:
        free_run = greedy(model, tuple(prompt), n)
        eos = free_run[rng.randrange(min(n, 20))]
        expected = free_run[: free_run.index(eos) + 1]
        got, stats = student.speculative_generate(model, draft_model, prompt, n, k=4, eos_token_id=eos)
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, f"with eos_token_id={eos}, generation should stop right after the target's EOS {hint}.\n{problem}"
        assert stats.generated == len(got), f"stats.generated ({stats.generated}) must count only the tokens returned {hint}."


class ScriptedDraft:
    """A fake draft that knows the target's greedy continuation and proposes it with one wrong token at
    index `wrong_at` of each proposal (None: always right; "all": every token wrong). With `eos`, it
    stops drafting right after that token (a proposal shorter than k, as a draft may return)."""

    def __init__(self, prompt, continuation, wrong_at, vocab, eos=None):
        self.prompt_len, self.continuation, self.wrong_at, self.vocab, self.eos = len(prompt), continuation, wrong_at, vocab, eos
        self.forwards = 0

    def propose(self, context, k, sampling=GREEDY, generator=None):
        start = len(context) - self.prompt_len
        tokens = self.continuation[start:start + k]
        tokens = [(t + 1) % self.vocab if self.wrong_at == "all" or i == self.wrong_at else t for i, t in enumerate(tokens)]
        if self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos) + 1]
        return tokens, torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), self.vocab).float().view(len(tokens), self.vocab)


class CountingDraft:
    """Wraps a draft (a gpt.py model or a ScriptedDraft) and records how many tokens each propose() returned."""

    def __init__(self, student, draft):
        self.inner = draft if hasattr(draft, "propose") else student.DraftModel(draft)
        self.proposed = []  # per call: (k asked, tokens returned)

    @property
    def forwards(self):
        return self.inner.forwards

    def propose(self, context, k, sampling=GREEDY, generator=None):
        tokens, probs = self.inner.propose(context, k, sampling, generator)
        self.proposed.append((k, len(tokens)))
        return tokens, probs


@pytest.mark.parametrize("where", ["first", "middle", "last", "always agrees", "never agrees"])
def test_7e_scripted_drafts(student, model, tokenizer, cases, where):
    """Drafts that disagree at the first, a middle or the last position of every proposal, or never, or
    always: the output is the target's all the same, and each round yields exactly the agreeing prefix
    and one token (k + 1 tokens per target forward for a draft that always agrees)."""
    k, hint = 5, f"(see {HINTS}, 7e)"
    wrong_at = {"first": 0, "middle": 2, "last": k - 1, "always agrees": None, "never agrees": "all"}[where]
    per_round = {"first": 1, "middle": 3, "last": k, "always agrees": k + 1, "never agrees": 1}[where]
    for prompt, n in cases[:2]:
        expected = greedy(model, tuple(prompt), n)
        draft = ScriptedDraft(prompt, expected + [0] * k, wrong_at, model.config.vocab_size)
        with count_model_work(model) as work:
            got, stats = student.speculative_generate(model, draft, prompt, n, k=k, eos_token_id=-1)
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, f"with a draft that {where if where.endswith('agrees') else 'is wrong at the ' + where + ' position'}, the output must still be the target's {hint}.\n{problem}"
        rounds_expected = math.ceil(n / per_round)
        assert work.forward_passes == rounds_expected, (
            f"k={k}, a draft that {where if where.endswith('agrees') else 'is wrong at the ' + where + ' position'}: each round should "
            f"return {per_round} token(s), so {n} tokens take {rounds_expected} target forwards; counted {work.forward_passes}. "
            f"Keep the agreeing prefix, then the target's own token (the bonus token when all {k} agree) {hint}.")
        assert_stats_match(stats, got, work, None, hint)
        assert stats.accepted == n - rounds_expected, f"stats.accepted is {stats.accepted}; {n} tokens in {rounds_expected} rounds accept {n - rounds_expected} drafts {hint}."


@pytest.mark.parametrize("draft_kind", ["real draft", "always agrees", "stops at its EOS"])
def test_7e_drafted_counts_the_tokens_really_drafted(student, model, draft_model, tokenizer, cases, seed, draft_kind):
    """stats.drafted counts the draft tokens each round really proposed: fewer than k in a last round
    (never draft what could not be returned) or when the draft stops early (here at its EOS), so that
    acceptance_rate = accepted / drafted is the share of drafted tokens the target kept."""
    k, hint = 5, f"(see {HINTS}, 7e)"
    rng = random.Random(f"{seed} {draft_kind}")
    for prompt, n in cases[:2]:
        n = n - n % (k + 1) + rng.randint(2, k)  # an always-agreeing draft then ends with a short round
        expected = greedy(model, tuple(prompt), n)
        eos = -1
        if draft_kind == "real draft":
            draft = CountingDraft(student, draft_model)
        elif draft_kind == "always agrees":
            draft = CountingDraft(student, ScriptedDraft(prompt, expected + [0] * k, None, model.config.vocab_size))
        else:
            eos = expected[rng.randrange(k + 2, n - 1)]
            expected = expected[: expected.index(eos) + 1]
            draft = CountingDraft(student, ScriptedDraft(prompt, expected + [0] * k, None, model.config.vocab_size, eos=eos))
        decoder = student.SpeculativeDecoder(model, draft, prompt, k=k, eos_token_id=eos)
        got = []
        for round_ in range(n):
            if len(got) >= n or decoder.finished:
                break
            before, calls, wanted = decoder.stats.drafted, len(draft.proposed), n - len(got)
            got += decoder.step(wanted)
            really = sum(returned for _, returned in draft.proposed[calls:])
            asked = [asked for asked, _ in draft.proposed[calls:]]
            assert decoder.stats.drafted - before == really, (
                f"round {round_} (k={k}, step({wanted})): the draft "
                f"was asked for {asked or 'nothing'} and returned {really} token(s), but stats.drafted grew by "
                f"{decoder.stats.drafted - before}. Count the tokens the draft really proposed (len of what propose() returned), not "
                f"k: a last round drafts at most max_tokens - 1, and a draft may stop early {hint}.")
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, f"with a draft that {draft_kind}, the output must be the target's greedy tokens {hint}.\n{problem}"
        stats = decoder.stats
        assert stats.drafted == sum(returned for _, returned in draft.proposed) and 0 <= stats.accepted <= stats.drafted, (
            f"stats: {stats.accepted} accepted of {stats.drafted} drafted; the draft proposed "
            f"{sum(returned for _, returned in draft.proposed)} tokens in all {hint}.")
        assert math.isclose(stats.acceptance_rate, stats.accepted / max(stats.drafted, 1)), f"acceptance_rate must be accepted / drafted {hint}."


def test_7e_never_drafts_what_could_not_be_returned(student, model, tokenizer, cases, seed):
    """A round asked for at most max_tokens tokens drafts at most max_tokens - 1 (the target adds one of its own):
    rounds of seeded sizes, 1 to k + 2, with a draft that is always right; the draft is never asked for more, the
    target's forward runs no draft beyond them, and every round still returns max_tokens tokens where k allows."""
    k, hint = 4, f"(see {HINTS}, 7e)"
    rng = random.Random(seed + 77)
    for prompt, n in cases[:2]:
        expected = greedy(model, tuple(prompt), n)
        draft = CountingDraft(student, ScriptedDraft(prompt, expected + [0] * (k + 2), None, model.config.vocab_size))
        decoder = student.SpeculativeDecoder(model, draft, prompt, k=k, eos_token_id=-1)
        got = []
        while len(got) < n:
            wanted = min(n - len(got), rng.randint(1, k + 2))
            calls, uncached = len(draft.proposed), len(decoder.tokens) - len(decoder.cache)
            with count_model_work(model) as work:
                new = decoder.step(wanted)
            asked = [asked for asked, _ in draft.proposed[calls:]]
            assert all(a <= wanted - 1 for a in asked), (
                f"after {plural(len(got), 'token')} (k={k}): step({wanted}) asked the draft for {asked} tokens; at most {wanted} tokens can "
                f"come back, the last of them the target's own, so a round drafts at most max_tokens - 1 = {wanted - 1}: never "
                f"draft what could not be returned (and with max_tokens = 1, draft nothing) {hint}.")
            assert work.forward_passes == 1 and work.tokens <= uncached + wanted - 1, (
                f"step({wanted}) ran {work.forward_passes} target forwards over {work.tokens} tokens; one forward over the "
                f"{uncached} uncached token(s) and at most {wanted - 1} drafts {hint}.")
            assert len(new) == min(wanted, k + 1), (
                f"step({wanted}) with a draft that is always right returned {plural(len(new), 'token')}; expected min(max_tokens, k + 1) = "
                f"{min(wanted, k + 1)} {hint}.")
            got += new
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, f"rounds of seeded sizes must still return the target's greedy tokens {hint}.\n{problem}"


# ----------------------------------------------------------------------------------------------
# 7e: greedy decoding with a repetition penalty

PENALTY = 1.5  # strong enough that the tiny model's penalised greedy text differs from its plain one


@functools.cache
def penalized_greedy(model, prompt, n, penalty):
    """The target's own greedy decoding under a repetition penalty, one token at a time (exercise 2's
    cached forward, then workshop/serving/sampling.py's processors with the prompt and output as history)."""
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    cache, tokens, feed = kv.KVCache(model.config.n_layer), list(prompt), list(prompt)
    with torch.no_grad():
        for _ in range(n):
            positions = torch.arange(len(cache), len(cache) + len(feed), device=model.device)[None]
            logits = kv.forward(model, torch.tensor([feed], device=model.device), positions, cache)[0, -1:]
            token = int(filter_logits(logits.float(), [params], [tokens]).argmax(dim=-1))
            tokens.append(token)
            feed = [token]
    return tokens[len(prompt):]


def compare_penalized(got, expected, model, prompt, tokenizer, penalty):
    """None when equal or first different at a near tie of the penalised logits; else where they differ."""
    problem = describe_token_mismatch(got, expected, tokenizer, prompt)
    if problem is None:
        return None, None
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    if i is None:
        return problem, None
    if 0 <= got[i] < model.config.vocab_size:
        history = list(prompt) + expected[:i]
        logits = filter_logits(full_logits(model, history)[-1:], [SamplingParams(repetition_penalty=penalty)], [history])[0]
        if (logits[expected[i]] - logits[got[i]]).item() < TIE_EPSILON:
            return None, None  # a near tie that float rounding may flip
    return problem, i


@pytest.mark.parametrize("draft_kind", ["never agrees", "real draft"])
def test_7e_greedy_with_repetition_penalty_is_the_targets_own(student, model, draft_model, tokenizer, cases, draft_kind):
    """Greedy sampling with a repetition penalty: the output is the target's own greedy decoding with
    that penalty. With a draft that is always wrong, every token is the target's prediction at the first
    verified position, whose history is the accepted text alone: only the penalty itself is tested."""
    k, hint = (4, f"(see {HINTS}, 7e)") if draft_kind == "real draft" else (2, f"(see {HINTS}, 7e)")
    sampling = SamplingParams(temperature=0.0, repetition_penalty=PENALTY)
    for prompt, n in cases if draft_kind == "real draft" else cases[:2]:  # a draft never right: a round per token
        expected = penalized_greedy(model, tuple(prompt), n, PENALTY)
        draft = draft_model if draft_kind == "real draft" else ScriptedDraft(prompt, expected + [0] * k, "all", model.config.vocab_size)
        got, _ = student.speculative_generate(model, draft, prompt, n, k=k, sampling=sampling, eos_token_id=-1)
        problem, i = compare_penalized(got, expected, model, prompt, tokenizer, PENALTY)
        plain = greedy(model, tuple(prompt), n)
        cause = ("your token is the one the target prefers WITHOUT the penalty: greedy verification must compare the drafts with "
                 "the argmax of the penalised logits (the target's logits through probabilities(..., self.sampling, histories)), "
                 "not the raw logits" if i is not None and i < len(got) and got[:i + 1] == plain[:i + 1] else
                 "the penalty must be applied to the target's logits at every verified position, each with the history before it")
        assert problem is None, (f"speculative_generate with {sampling} and a draft that {draft_kind} must return the target's own "
                                 f"greedy decoding with that penalty.\n{problem}\n  Likely cause: {cause} {hint}.")


def test_7e_penalty_history_includes_the_drafted_tokens(student, model, tokenizer, cases):
    """A draft that always proposes the target's own penalised greedy text: every draft is accepted
    (k + 1 tokens a round) only if the target's prediction at verified position i is penalised with the
    accepted text AND the drafted tokens before i as history, as plain decoding would see them."""
    k, hint = 5, f"(see {HINTS}, 7e)"
    sampling = SamplingParams(temperature=0.0, repetition_penalty=PENALTY)
    for prompt, n in cases:
        expected = penalized_greedy(model, tuple(prompt), n, PENALTY)
        draft = ScriptedDraft(prompt, expected + [0] * k, None, model.config.vocab_size)
        with count_model_work(model) as work:
            got, stats = student.speculative_generate(model, draft, prompt, n, k=k, sampling=sampling, eos_token_id=-1)
        problem, i = compare_penalized(got, expected, model, prompt, tokenizer, PENALTY)
        where = ""
        if i is not None:
            j = i % (k + 1)
            where = (f"It is verified position {j} of round {i // (k + 1)} (each round should accept all {k} drafts). Likely cause: "
                     + (f"the target's prediction there must be penalised with the accepted text and the {j} drafted token(s) before "
                        f"it, {tokenizer.decode(expected[i - j:i])!r}, as history" if j else
                        "the first verified position of a round has the accepted text as its history, so the penalty itself is "
                        "missing or wrong there"))
            if i < len(got) and got[i] == int(full_logits(model, list(prompt) + expected[:i])[-1].argmax()):
                where += "; your token is the one the target prefers with no penalty at all: is the penalty applied to the target's logits?"
        assert problem is None, (f"with {sampling} and a draft that proposes the target's own penalised text, the output must be "
                                 f"that text.\n{problem}\n  {where} {hint}.")
        rounds_expected = math.ceil(n / (k + 1))
        assert work.forward_passes == rounds_expected, (
            f"a draft that proposes the target's own penalised text is always right, so {n} tokens take {rounds_expected} "
            f"rounds of {k + 1}; counted {work.forward_passes} target forwards. Score row i of the verification with the "
            f"history self.tokens + drafted[:i] {hint}.")


def test_7e_target_cache_holds_exactly_the_accepted_text(student, model, draft_model, cases):
    """After each round, the target's cache holds the keys and values of the accepted text but its last
    token, as a fresh prefill computes them: rejected drafts are gone."""
    hint = f"(see {HINTS}, 7d and 7e)"
    for prompt, n in cases[:2]:
        decoder = student.SpeculativeDecoder(model, draft_model, prompt, k=4, eos_token_id=-1)
        produced = 0
        while produced < n:
            produced += len(decoder.step(n - produced))
            tokens = decoder.tokens
            assert len(decoder.cache) == len(tokens) - 1, (
                f"after a round, the accepted text is {plural(len(tokens), 'token')}; the target's cache must hold all but the last, "
                f"{len(tokens) - 1} positions, not {len(decoder.cache)} {hint}.")
            fresh = kv.KVCache(model.config.n_layer)
            with torch.no_grad():
                kv.forward(model, torch.tensor([tokens[:-1]], device=model.device), torch.arange(len(tokens) - 1, device=model.device)[None], fresh)
            error = max((decoder.cache.keys[i] - fresh.keys[i]).abs().max().item() for i in range(model.config.n_layer))
            assert error < 1e-4, f"the target's cache differs from a fresh prefill of the accepted text by {error:.2e} {hint}."


@pytest.mark.slow
def test_7e_sampled_output_follows_the_target(student, model, draft_model, seed):
    """End to end with the real draft and top-k 6 sampling: the first token and the second (after the
    most likely first) follow the target's own distributions (chi-square, significance 1e-5 each)."""
    hint = f"(see {HINTS}, 7c and 7e)"
    prompt = sample_prompts(model, 1, 3, 12, seed + 76)[0]
    runs = 600
    outputs = [student.speculative_generate(model, draft_model, prompt, 2, k=2, sampling=SamplingParams(top_k=6, seed=seed * runs + i))[0]
               for i in audited_first(runs)]
    params = SamplingParams(top_k=6)
    firsts = [o[0] for o in outputs]
    mode = max(set(firsts), key=firsts.count)
    checks = [("the first token", prompt, firsts),
              (f"the second token, after the first {mode}", prompt + [mode], [o[1] for o in outputs if o[0] == mode and len(o) > 1])]
    for which, context, drawn in checks:
        probs = filter_logits(full_logits(model, context)[-1:], [params]).softmax(-1)[0].cpu()
        counts = torch.bincount(torch.tensor(drawn), minlength=len(probs)).double()
        assert counts[probs == 0].sum() == 0, f"{which} was one that top-k 6 removes {hint}."
        p_value, stat = chi_square_p_value(counts[probs > 0], probs[probs > 0])
        assert p_value > SIGNIFICANCE, (f"{which} does not follow the target's distribution (chi-square {stat:.1f}, p = {p_value:.2e}) "
                                        f"{hint}.\n  counts   {counts[probs > 0].long().tolist()}\n  expected "
                                        f"{[round(x) for x in (probs[probs > 0] * len(drawn)).tolist()]}")


def test_7e_statistics_are_ratios_of_the_counts(student):
    stats = student.SpeculativeStats(target_forwards=8, draft_forwards=32, drafted=32, accepted=20, generated=28)
    assert math.isclose(stats.acceptance_rate, 20 / 32) and math.isclose(stats.tokens_per_target_forward, 28 / 8), (
        f"acceptance_rate = accepted / drafted, tokens_per_target_forward = generated / target_forwards (see {HINTS}, 7e).")
    empty = student.SpeculativeStats()
    assert empty.acceptance_rate == 0.0 and empty.tokens_per_target_forward == 0.0, "before any round both rates are 0.0 (no division by zero)."


@pytest.mark.timing
def test_7e_speed_against_reference(student, model, draft_model, tokenizer, device, cases):
    prompt, n = cases[0]
    problem = compare_tokens(student.speculative_generate(model, draft_model, prompt, n)[0], greedy(model, tuple(prompt), n), model, prompt, tokenizer)
    assert problem is None, f"correctness first: see the other checks.\n{problem}"
    timing = paired_timing(lambda: student.speculative_generate(model, draft_model, prompt, n),
                           lambda: reference.speculative_generate(model, draft_model, prompt, n), device=device)
    limit = 2.0 if device == "cpu" else 1.5
    assert timing.ratio < limit, (f"your speculative_generate takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n"
                                  f"{timing.report('yours', 'reference')}")


# ----------------------------------------------------------------------------------------------
# 7f (stretch): Jacobi decoding

@pytest.fixture(scope="module")
def position_only_model(model):
    """A copy of the tiny model that reads positions and ignores tokens: token embeddings zero, every
    block's output projections zero (the residual stream is the position's embedding alone), and a seeded
    random output layer of its own. Its greedy token at each position is fixed whatever came before, so a
    guess taken from a forward's predictions is always right; and no token follows itself (checked)."""
    m = copy.deepcopy(model)
    m.lm_head = torch.nn.Linear(m.config.n_embd, m.config.vocab_size, bias=False, device=model.device)  # untied from wte
    with torch.no_grad():
        m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
        m.transformer.wte.weight.zero_()
        for block in m.transformer.h:
            for projection in (block.attn.c_proj, block.mlp.c_proj):
                projection.weight.zero_()
                projection.bias.zero_()
    return on_device(m)


class Forwards:
    """What each forward of a model ran: its number of tokens, and their positions (None where the forward
    did not go through transformer.wpe, which every path of gpt.py and exercise 2 does)."""

    def __init__(self, model):
        self.model, self.tokens, self.positions = model, [], []

    def __enter__(self):
        self.handles = [self.model.transformer.wte.register_forward_hook(lambda m, args, out: self.tokens.append(args[0].numel())),
                        self.model.transformer.wpe.register_forward_hook(lambda m, args, out: self.positions.append(args[0].flatten().tolist()))]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def __len__(self):
        return len(self.tokens)

    def at(self, i):
        """The positions forward i ran, or None when they were not seen."""
        return self.positions[i] if len(self.positions) == len(self.tokens) else None


def check_jacobi_work(stats, got, forwards, prompt, max_new_tokens, n_guess, eos, hint):
    """What jacobi_generate ran and counted, against the contract: every forward runs the text's last token (not
    in the cache yet) and at most n guesses, n of them when there is room, none at a position past
    max_new_tokens; the statistics are what ran and came back."""
    call = f"jacobi_generate(prompt of {plural(len(prompt), 'token')}, max_new_tokens={max_new_tokens}, n={n_guess}, eos_token_id={eos})"
    sizes = list(forwards.tokens)
    assert sizes, f"{call} ran no forward of the target {hint}."
    guesses = [sizes[0] - len(prompt)] + [size - 1 for size in sizes[1:]]  # each forward: the uncached text, then the guesses
    assert guesses[0] >= 0 and max(guesses) <= n_guess, (
        f"{call}: the forwards ran {sizes[:12]}{'...' if len(sizes) > 12 else ''} tokens: the first should run the prompt and at "
        f"most n = {n_guess} guesses, each later one the text's last token (its keys and values are not cached yet) and at most "
        f"{n_guess} guesses. Guess the next n tokens, n as asked {hint}.")
    if max_new_tokens > n_guess + 1 and (eos == -1 or len(sizes) > 1):
        assert max(guesses) == n_guess, (
            f"{call}: the forwards ran {sizes[:12]}{'...' if len(sizes) > 12 else ''} tokens, never the text's last token and "
            f"{n_guess} guesses: the window is n = {n_guess} guesses wide whenever max_new_tokens leaves room {hint}.")
    last = len(prompt) + max_new_tokens - 2  # the position whose prediction is the last token that may come back
    beyond = [(i, max(forwards.at(i))) for i in range(len(forwards)) if forwards.at(i) and max(forwards.at(i)) > last]
    assert not beyond, (
        f"{call}: forward {beyond[0][0]} ran position {beyond[0][1]}, past {last}, the last one whose prediction can come back "
        f"(prompt + max_new_tokens - 2): never guess past max_new_tokens, at most max_new_tokens - generated - 1 guesses "
        f"{hint}.")
    if all(forwards.at(i) for i in range(len(forwards))):  # positions seen: how many tokens came back before each forward
        for i in range(len(forwards)):
            made = 0 if i == 0 else forwards.at(i)[0] - len(prompt) + 1  # forward i starts at the text's last token
            room = min(n_guess, max_new_tokens - made - 1)
            assert guesses[i] == room, (
                f"{call}: forward {i}, after {made} tokens came back, verified {guesses[i]} guesses; the window is n = "
                f"{n_guess} guesses wide wherever max_new_tokens leaves room, and max_new_tokens - generated - 1 = "
                f"{max_new_tokens - made - 1} where it does not: {room} here {hint}.")
    assert stats.generated == len(got), f"{call}: stats.generated is {stats.generated}, but {plural(len(got), 'token')} came back {hint}."
    assert stats.target_forwards == len(forwards) <= len(got), (
        f"{call}: stats.target_forwards is {stats.target_forwards}; counted {len(forwards)} forwards of the target for "
        f"{plural(len(got), 'token')} (each forward returns at least one) {hint}.")
    assert stats.draft_forwards == 0, (
        f"{call}: stats.draft_forwards is {stats.draft_forwards}: there is no draft model, the guesses come with the target's "
        f"forwards for free; draft_forwards stays 0 {hint}.")
    verified = sum(guesses)
    assert 0 <= stats.accepted <= stats.drafted <= verified, (
        f"{call}: stats say {stats.accepted} accepted of {stats.drafted} drafted; the forwards verified {verified} guesses. "
        f"drafted counts the guesses each forward really verified (fewer than n where max_new_tokens cuts the window), "
        f"accepted those the verification kept, never more than drafted {hint}.")
    if eos == -1:
        assert stats.generated == stats.accepted + stats.target_forwards, (
            f"{call}: every forward returns the guesses it kept and one token of the target's own, so generated "
            f"({stats.generated}) = accepted ({stats.accepted}) + target_forwards ({stats.target_forwards}); accepted counts "
            f"only the kept guesses, not the target's own token {hint}.")
    else:
        assert stats.generated <= stats.accepted + stats.target_forwards, (
            f"{call}: {stats.generated} tokens came back from {stats.target_forwards} forwards that kept {stats.accepted} "
            f"guesses: a forward returns its kept guesses and at most one token of the target's own {hint}.")


@pytest.mark.parametrize("n_guess", [2, 5])
def test_7f_jacobi_is_greedy_and_counts_its_forwards(student, model, tokenizer, cases, n_guess):
    """The target's greedy tokens, from a window of n guesses: each forward runs the text's last token and
    at most n guesses (n where there is room), never a position past max_new_tokens. The statistics are
    what ran and came back: target_forwards the forwards counted (never more than the tokens), generated
    the tokens returned, drafted the guesses verified, accepted those kept (at most drafted), and each
    forward returns its kept guesses and one token of its own (generated = accepted + target_forwards);
    draft_forwards stays 0. (On the real model a guess comes true only where the greedy text repeats
    itself: fewer forwards is graded on position_only_model below, where it is certain.)"""
    hint = f"(see {HINTS}, 7f)"
    for prompt, n in cases:
        with Forwards(model) as forwards:
            got, stats = student.jacobi_generate(model, prompt, n, n=n_guess, eos_token_id=-1)
        problem = compare_tokens(got, greedy(model, tuple(prompt), n), model, prompt, tokenizer)
        assert problem is None, f"jacobi_generate(n={n_guess}) must return the target's greedy tokens {hint}.\n{problem}"
        check_jacobi_work(stats, got, forwards, prompt, n, n_guess, -1, hint)


@pytest.mark.parametrize("which", ["real model", "position-only model"])
def test_7f_jacobi_stops_right_after_eos(student, model, position_only_model, tokenizer, cases, seed, which):
    """A token the greedy text really produces is made the EOS (one the prompt holds too, where there is
    one): the output is the greedy text up to it and nothing after it, even where the EOS is a guess kept
    in the middle of a forward's tokens (certain on position_only_model) or only predicted beyond the
    kept ones; no forward runs after the one that produced it; the statistics count what came back. On
    position_only_model, where guesses come true in whole windows, each prompt runs with n = 2, 3 and 5,
    each with an EOS of its own: one at least falls inside a window, not at its end."""
    hint, m = f"(see {HINTS}, 7f)", model if which == "real model" else position_only_model
    rng = random.Random(f"{seed} {which}")
    runs = ([(prompt, n, [2, 5][i % 2]) for i, (prompt, n) in enumerate(cases)] if which == "real model" else
            [(prompt, n, n_guess) for prompt, n in cases for n_guess in (2, 3, 5)])
    for prompt, n, n_guess in runs:
        free_run = greedy(m, tuple(prompt), 20)
        # Where it can, a token the prompt holds too, produced after the first token: stopping on the prompt's shows then.
        in_prompt = [j for j in range(1, 19) if free_run[j] in prompt and free_run.index(free_run[j]) == j]
        eos = free_run[rng.choice(in_prompt or range(19))]
        expected = free_run[: free_run.index(eos) + 1]
        with Forwards(m) as forwards:
            got, stats = student.jacobi_generate(m, prompt, n, n=n_guess, eos_token_id=eos)
        call = f"jacobi_generate on the {which}, n={n_guess}, eos_token_id={eos} ({tokenizer.decode([eos])!r})"
        where = " (it occurs in the prompt too: only the target's token stops)" if eos in prompt else ""
        problem = compare_tokens(got, expected, m, prompt, tokenizer)
        assert problem is None, (
            f"{call}{where}: the output is the greedy text up to the first EOS the target produces, that EOS included, and "
            f"nothing after it: a forward may keep guesses past the EOS, cut them off; and a guess or a prediction that was "
            f"not kept stops nothing {hint}.\n{problem}")
        decided = len(prompt) + len(expected) - 2  # the position whose prediction is the EOS
        positions = forwards.at(len(forwards) - 1) if got == expected else None  # past a near tie, where the EOS comes is unknown
        assert positions is None or decided in positions, (
            f"{call}: the EOS is new token {len(expected) - 1}, predicted at position {decided}, but the last of the "
            f"{len(forwards)} forwards ran positions {positions[:3]}...{positions[-1:]}: a forward ran after the one that "
            f"produced the EOS, which is wasted work. Stop as soon as the EOS is among the tokens kept {hint}.")
        check_jacobi_work(stats, got, forwards, prompt, n, n_guess, eos, hint)


@pytest.mark.parametrize("n_guess", [2, 5])
def test_7f_jacobi_guesses_from_predictions_come_true(student, position_only_model, cases, n_guess):
    """On a model whose predictions ignore the tokens, the guesses that are a forward's predictions at the
    positions after the accepted ones all come true: after a forward whose guesses were not all kept,
    the next forward keeps every guess those predictions gave it (old guesses past a mismatch were made
    from a text now known wrong: they are all replaced), so every prompt needs fewer forwards than tokens
    (its greedy text never has a token twice in a row, so guessing the last token again gains nothing)."""
    hint, m = f"(see {HINTS}, 7f)", position_only_model
    for prompt, n in cases:
        expected = greedy(m, tuple(prompt), n)
        assert all(a != b for a, b in zip(expected, expected[1:])), "the checker's own set-up: a token repeats"
        with Forwards(m) as forwards:
            got, stats = student.jacobi_generate(m, prompt, n, n=n_guess, eos_token_id=-1)
        assert got == expected, f"jacobi_generate(n={n_guess}) must return the greedy tokens {hint}: got {got[:8]}..., expected {expected[:8]}..."
        assert len(forwards) < len(got), (
            f"{len(forwards)} forwards for {plural(len(got), 'token')} on a model whose predictions depend on positions only: no guess "
            f"ever came true. The next guesses are the target's predictions at the positions after the accepted ones, taken from the "
            f"forward that just ran {hint}.")
        check_jacobi_work(stats, got, forwards, prompt, n, n_guess, -1, hint)
        runs = [forwards.at(i) for i in range(len(forwards))]
        if not all(runs):
            continue  # positions not seen (a forward that bypasses transformer.wpe): what each forward kept is unknown
        # Each forward runs the text's last token (not cached yet), then its guesses: from where each starts, what each kept.
        ends = [len(prompt) - 1] + [run[0] for run in runs[1:]] + [len(prompt) + len(got) - 1]
        guessed = [run[-1] - end for run, end in zip(runs, ends)]
        kept = [ends[i + 1] - ends[i] - 1 for i in range(len(runs))]
        assert all(0 <= k <= g for k, g in zip(kept, guessed)), (
            f"jacobi_generate(n={n_guess}): the forwards ran positions {[(r[0], r[-1]) for r in runs][:10]}...: each forward runs "
            f"the text's last token (its keys and values are not cached yet) and its guesses, nothing the cache holds already "
            f"{hint}.")
        for i in range(len(runs) - 1):
            owed = min(guessed[i + 1], guessed[i] - kept[i])  # the predictions past the kept tokens, all right on this model
            assert kept[i] == guessed[i] or kept[i + 1] >= owed, (
                f"jacobi_generate(n={n_guess}), prompt of {plural(len(prompt), 'token')}: forward {i} kept {kept[i]} of its {guessed[i]} "
                f"guesses, and predicted the {guessed[i] - kept[i]} positions after the tokens it kept; on this model a "
                f"prediction is right whatever came before it, yet forward {i + 1} kept only {kept[i + 1]} of its "
                f"{guessed[i + 1]} guesses. After a mismatch every guess past it is replaced by the forward's new predictions: "
                f"the old ones were made from a text now known wrong {hint}.")


# ----------------------------------------------------------------------------------------------
# Differential checks: generated scenarios, the same calls on the reference and yours, compared after every call
# (workshop/grading/differential.py). A failure shows the smallest scenario hypothesis found and the first divergence.

CLOSE = Tolerance(rtol=1e-4, atol=1e-5)  # logits, probabilities and cached keys: the same maths, the forward cut in other pieces


def describe(m):
    return f"a model of {m.config.n_layer} layer(s), {m.config.n_head} head(s), width {m.config.n_embd}, context {m.config.n_positions}"


def observe_cache(cache):
    """What a KVCache promises: its length and every layer's keys and values (an emptied layer may be None or hold 0 positions)."""
    def layer(t):
        return None if t is None or t.shape[2] == 0 else t
    return read({"len(cache)": len(cache), "keys": [layer(t) for t in cache.keys], "values": [layer(t) for t in cache.values]})


def samplings():
    """Greedy; greedy with a repetition penalty above and below 1; top-k 1 sampling, through the sampled path but with
    one-hot rows (its tokens are certain: the penalised greedy text); real sampling (top-k, top-p, temperatures), seeded."""
    penalty = st.sampled_from([0.7, 1.3, 2.0])
    return st.one_of(st.just(GREEDY),
                     penalty.map(lambda r: SamplingParams(temperature=0.0, repetition_penalty=r)),
                     st.builds(lambda t, r, s: SamplingParams(temperature=t, top_k=1, repetition_penalty=r, seed=s),
                               st.sampled_from([0.5, 1.5]), st.sampled_from([1.0, 1.3]), st.integers(0, 999)),
                     st.builds(lambda t, k, p, s: SamplingParams(temperature=t, top_k=k, top_p=p, seed=s),
                               st.sampled_from([0.8, 1.4]), st.sampled_from([0, 5]), st.sampled_from([1.0, 0.9]), st.integers(0, 999)))


def certain(sampling):
    """Whether the tokens are certain under this sampling (greedy, or top-k 1), so that yours must equal the reference's."""
    return sampling.greedy or sampling.top_k == 1


def fresh_generator(state):
    generator = torch.Generator()
    generator.set_state(state)
    return generator


@st.composite
def rollback_scenarios(draw):
    """A cache of 1-3 layers (batch, heads and width of their own) holding a length around 4 and 8 (0 included: an empty
    cache), then rollbacks to 0, the length itself, one less, one past and -1 (errors), and appends in between."""
    shape = tuple(draw(st.integers(1, high)) for high in (3, 2, 3, 4))  # layers, batch, heads, head_dim
    length = draw(around(4, 8, low=0, high=12))
    ops, now = [], length
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.sampled_from(["rollback", "rollback", "update"])) == "rollback":
            to = draw(st.one_of(st.sampled_from([-1, 0, now - 1, now, now + 1]), st.integers(0, max(now, 0))))
            ops.append(("rollback", to))
            now = to if 0 <= to <= now else now
        else:
            ops.append(("update", draw(st.integers(1, 3))))
            now += ops[-1][1]
    return shape, length, ops


def test_7d_differential_rollback(student, seed):
    """rollback against the reference on generated caches: after every rollback and every append, the length and every
    layer's keys and values; a ValueError exactly where the reference raises one, and the cache untouched by it."""
    def check(scenario):
        (layers, batch, heads, width), length, ops = scenario
        g = torch.Generator().manual_seed(seed)

        def positions(t):
            return [(torch.randn(batch, heads, t, width, generator=g), torch.randn(batch, heads, t, width, generator=g)) for _ in range(layers)]
        cache = kv.KVCache(layers)
        for layer, (k, v) in enumerate(positions(length) if length else []):
            cache.update(layer, k, v)
        log = [f"cache = a KVCache of {layers} layer(s) holding {length} position(s) (keys [{batch}, {heads}, {length}, {width}])"]
        twins = Twins((reference, copy.deepcopy(cache)), (student, copy.deepcopy(cache)), lambda side: observe_cache(side[1]),
                      hint=f"Hint: see {HINTS}, 7d.", log=log)
        for op, n in ops:
            if op == "rollback":
                twins.call(f"rollback(cache, {n})", lambda side: side[0].rollback(side[1], n))
                twins.check("the cache after that call")  # also after a refused rollback: it must leave the cache as it was
            else:
                new = positions(n)
                twins.call(f"cache.update(layer, keys, values) with {n} new position(s), every layer",
                           lambda side: [side[1].update(layer, k, v) for layer, (k, v) in enumerate(new)], returns=None)

    explore(rollback_scenarios(), check, seed=seed, examples=30, edges=ROLLBACK_EDGES)


# Tried first at every seed (issue 41): an empty cache of one layer of [1, 1, ., 1] rolled back to 0, to -1 and one past
# its length (refused); a cache of 8 rolled back to its length, one less, after appends to 0, then one past 0 (refused).
ROLLBACK_EDGES = [
    ((1, 1, 1, 1), 0, [("rollback", 0), ("rollback", -1), ("update", 1), ("rollback", 2)]),
    ((3, 2, 2, 4), 8, [("rollback", 8), ("rollback", 7), ("update", 3), ("rollback", 0), ("rollback", 1)]),
]


@st.composite
def propose_scenarios(draw):
    """A draft (tiny-draft, or a random model of other sizes and a short context), a context of 1 token or more, a
    sampling, and rounds as the decoding loop makes them: k drafts (1, 4 and around), then the next context keeps none,
    some or all of them and adds one other token (an edge id: <|endoftext|>, 0, the last id); sometimes a second context,
    for a second draft used in turn with the first."""
    config = draw(st.one_of(st.none(), small_config()))
    contexts = draw(st.lists(prompts(1, 2, min_len=1, max_len=10), min_size=1, max_size=2))
    same_k = draw(st.one_of(st.none(), around(1, 4, low=1, high=6)))  # the same k every round, or each its own
    rounds = draw(st.lists(st.tuples(st.just(same_k) if same_k else around(1, 4, low=1, high=6), st.sampled_from(["none", "all", "some"]),
                                     st.integers(0, 5), token_ids()), min_size=2, max_size=3))
    return config, contexts, draw(st.one_of(st.just(GREEDY), samplings())), rounds, draw(st.integers(0, 2**16))


def observe_propose(drafter, context, k, sampling, generator, known):
    """What the contract promises of one propose(): the tokens (certain samplings: the reference's; real sampling: k ints,
    each where its row has weight, the same ones a fresh draft draws with the generator in the same state, whatever
    torch's global seed), the probs (dtype, shape, CPU; one-hot rows on the tokens where certain; else row 0, the
    distribution after the context, and every row the draft's distribution after context + tokens[:i]), k or k + 1
    forwards, counted by DraftModel.forwards, over only what the cache could not hold and the drafts."""
    model, before, state = drafter.model, drafter.forwards, generator.get_state()
    with count_model_work(model) as work:
        tokens, probs = drafter.propose(context, k, sampling, generator)
    reading = {"tokens": GreedyTokens(tokens, model, tuple(context)) if sampling == GREEDY else tokens if certain(sampling) else
               type(tokens) is list and len(tokens) == k and all(type(t) is int for t in tokens),
               "probs dtype, shape, device": (str(probs.dtype), tuple(probs.shape), probs.device.type)}
    if tuple(probs.shape) == (k, model.config.vocab_size) and len(tokens) == k:
        rows = probs[torch.arange(k), torch.tensor(tokens, dtype=torch.long)]
        if certain(sampling):
            reading["probs: one-hot rows on the tokens"] = bool((rows == 1).all() and (probs.sum(dim=1) == 1).all())
        else:
            reading["probs row 0 (after the context)"] = probs[:1].clone()
            with torch.no_grad():
                text = list(context) + list(tokens)
                logits = model(torch.tensor([text], device=model.device), torch.arange(len(text), device=model.device)[None])[0, len(context) - 1:-1]
            expected = reference.probabilities(logits, sampling, [text[:len(context) + i] for i in range(k)])
            reading["probs: row i the draft's distribution after context + tokens[:i]"] = bool(torch.allclose(probs, expected, atol=1e-4))
            reading["each token where its row has weight"] = bool((rows > 0).all())
            torch.manual_seed(int(torch.randint(2**31, (1,))) + 1)  # another global random state: it must not matter
            again, _ = type(drafter)(model).propose(context, k, sampling, fresh_generator(state))
            reading["a fresh draft, its generator in the same state, draws the same tokens"] = again == tokens
    reading["forwards: k or k + 1"] = work.forward_passes in (k, k + 1)
    reading["DraftModel.forwards counts them"] = drafter.forwards - before == work.forward_passes
    reading["positions run: at most what the cache lacks, and the drafts"] = work.tokens <= len(context) - known + k + 1
    return reading, tokens, probs


def test_7a_differential_propose(student, draft_model, seed):
    """DraftModel.propose against the reference, round after round on one draft (its cache carrying rejected drafts
    over), sometimes a second draft of the same model used in turn on another context, on drafts of other sizes, with
    greedy, penalised (above and below 1), top-k 1 and real sampling: observe_propose's reading after every call, and
    the probs of every earlier call unchanged by later ones."""
    def check(scenario):
        config, contexts, sampling, rounds, g_seed = scenario
        m = small_model(config, draft_model.device) if config else draft_model
        names = ["draft", "second"][:len(contexts)]
        twins = Twins(*[types.SimpleNamespace(drafts=[side.DraftModel(m) for _ in contexts], generator=make_generator(g_seed), held=[], tokens=None)
                        for side in (reference, student)], hint=f"Hint: see {HINTS}, 7a.",
                      log=[f"{' and '.join(names)} = DraftModel({describe(m)}); generator seeded {g_seed}; sampling {sampling}"])
        known = [0] * len(contexts)
        for k, keep, some, other in rounds:
            for j, context in enumerate(contexts):
                k = min(k, m.config.n_positions - len(context))
                if k < 1:
                    return

                def call(side, j=j, context=context, k=k):
                    reading, side.tokens, probs = observe_propose(side.drafts[j], context, k, sampling, side.generator, known[j])
                    side.held.append((probs, probs.clone()))  # what the caller holds, and what it held when returned
                    reading["probs of the earlier calls, unchanged"] = all(torch.equal(held, kept) for held, kept in side.held)
                    return reading
                twins.call(f"{names[j]}.propose(context={context}, k={k}, sampling, generator)", call, tol=CLOSE)
                accepted = {"none": 0, "all": k, "some": min(some, k)}[keep]
                known[j] = len(context) + accepted
                contexts[j] = context + twins.reference.tokens[:accepted] + [other]

    explore(propose_scenarios(), check, seed=seed, examples=20, edges=PROPOSE_EDGES)


# Tried first at every seed (issue 41): a context one short of a 16-position draft's end (k cut to 1, every draft kept:
# the context full); two drafts in turn, one head, contexts of one token (EOS, id 0), k 1 with none kept, then 4 with
# some kept, then 6 with all, the other tokens edge ids.
_CONTEXT_16 = gpt.GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2)
_ONE_HEAD = gpt.GPTConfig(n_positions=24, n_embd=4, n_layer=2, n_head=1)
PROPOSE_EDGES = [
    (_CONTEXT_16, [list(range(100, 115))], GREEDY, [(4, "all", 0, 0), (1, "none", 0, 50256)], 0),
    (_ONE_HEAD, [[50256], [0]], GREEDY, [(1, "none", 0, 0), (4, "some", 2, 50256), (6, "all", 0, 50255)], 1),
]


@st.composite
def verify_scenarios(draw):
    """A target (tiny, or a random model of other sizes), a prompt, rounds of k drafts (0, 1, 4 and around; random
    tokens, edge ids among them) of which some are kept, sometimes an extend() instead, and last, on a short context,
    a round whose drafts fill the context exactly."""
    config = draw(st.one_of(st.none(), small_config()))
    prompt = draw(prompts(1, 2, min_len=1, max_len=12))
    rounds = draw(st.lists(st.tuples(st.sampled_from(["verify", "verify", "extend"]), around(1, 4, low=0, high=6),
                                     st.lists(token_ids(), min_size=8, max_size=8), st.integers(0, 6)), min_size=1, max_size=3))
    return config, prompt, rounds, draw(st.booleans())


@st.composite
def accept_greedy_scenarios(draw):
    """k + 1 rows of logits with exact ties (and -inf, and large values), and k drafts: the last maximal token of their
    row (tied with the first, what greedy decoding writes, where a tie is), the first, or any token."""
    rows, vocab = draw(st.integers(1, 6)), draw(st.integers(2, 8))
    top_tied = st.lists(st.lists(st.sampled_from([-math.inf, 0.0, 1.0, 2.0, 2.0]), min_size=vocab, max_size=vocab).filter(
        lambda row: max(row) > -math.inf), min_size=rows, max_size=rows).map(torch.tensor)  # ties at the maximum, often
    logits = draw(st.one_of(top_tied, tied_logits(rows=(1, 6), vocab=(2, 10))))
    drafts = []
    for row in logits[:-1]:
        tied = (row == row.max()).nonzero().flatten().tolist()
        drafts.append(draw(st.one_of(st.just(tied[-1]), st.just(tied[0]), st.integers(0, len(row) - 1))))
    return drafts, logits


def test_7b_differential_verify(student, model, seed):
    """verify (and the given extend) against the reference: after every call the logits returned, the forwards and
    positions run through the target, and the whole cache (length, keys, values), rounds rolled back to the text kept;
    accept_greedy on logits with exact ties (greedy decoding writes the first maximal token), with no drafts too:
    the list returned (of ints), the arguments unchanged, the same list twice."""
    hint = f"Hint: see {HINTS}, 7b."

    def check(scenario):
        config, prompt, rounds, fill = scenario
        m = small_model(config, model.device) if config else model
        twins = Twins(*[(side, kv.KVCache(m.config.n_layer)) for side in (reference, student)], lambda side: observe_cache(side[1]),
                      hint=hint, tol=CLOSE, log=[f"target = {describe(m)}; cache = an empty KVCache"])
        context = list(prompt)
        if fill and config:  # a last round whose drafts fill the context exactly
            rounds = rounds + [("verify", None, rounds[-1][2], 0)]
        for what, k, tokens, keep in rounds:
            room = m.config.n_positions - len(context)
            k = room if k is None else min(k, room)
            drafts, keep = (tokens * (k // len(tokens) + 1))[:k], min(keep, k)
            feed = list(context[len(twins.reference[1]):]) + drafts  # for extend: what the cache lacks, and the drafts

            def run(side, what=what, context=context, drafts=drafts, feed=feed):
                with count_model_work(m) as work:
                    logits = side[0].verify(m, side[1], context, drafts) if what == "verify" else side[0].extend(m, side[1], feed)
                return {"logits": logits, "forwards": work.forward_passes, "positions run": work.tokens}
            call = (f"verify(target, cache, context={context}, draft_tokens={drafts})" if what == "verify" else
                    f"extend(target, cache, {feed})")
            out = twins.call(call, run)
            context = context + drafts[:keep] + [int(out.reference["logits"][-(k + 1):][keep].argmax())]
            if len(context) > m.config.n_positions:
                break
            twins.call(f"rollback(cache, {len(context) - 1}) (the reference's: the text kept, but its last token)",
                       lambda side, n=len(context) - 1: reference.rollback(side[1], n), returns=None)

    explore(verify_scenarios(), check, seed=seed, examples=20, edges=VERIFY_EDGES)

    def check_accept(scenario):
        drafts, logits = scenario
        twins = Twins(reference, student, hint=hint)
        twins.call(f"accept_greedy(draft_tokens={drafts}, target_logits={logits.tolist()})",
                   lambda side, d, l: side.accept_greedy(d, l), inputs=(drafts, logits), again=True)

    explore(accept_greedy_scenarios(), check_accept, seed=seed, examples=30, edges=ACCEPT_GREEDY_EDGES)


# Tried first at every seed (issue 41): a first round of no drafts after a prompt of three tokens (id 0, EOS: one row
# after the context, not a row per token run), an extend, 4 drafts all kept, then a last round whose drafts fill the
# 16-position context exactly.
VERIFY_EDGES = [(_CONTEXT_16, [0, 50256, 5], [("verify", 0, [50256, 0, 1, 2, 3, 4, 5, 6], 0), ("extend", 1, [7] * 8, 1),
                                              ("verify", 4, [0, 50256, 50255, 9, 9, 9, 9, 9], 4)], True)]
# accept_greedy: no drafts (the target's token alone, over a tie); a draft that is the last of tied maxima (greedy writes
# the first: rejected) after one that is the first; every draft kept, the bonus row all tied.
ACCEPT_GREEDY_EDGES = [
    ([], torch.tensor([[1.0, 1.0]])),
    ([0, 2], torch.tensor([[2.0, 2.0, -math.inf], [0.0, 1.0, 1.0], [2.0, 2.0, 2.0]])),
    ([1, 1], torch.tensor([[0.0, 2.0], [-math.inf, 30.0], [1.0, 1.0]])),
]


@st.composite
def accept_sampled_scenarios(draw):
    """k drafts (0 to 4) over a vocabulary of 2-6 tokens. The rows of q and p are drawn from a few weights (exact zeros
    and ties), or p's row is q's (always accepted), or one-hot; or p is q at every draft and one-hot after (every draft
    kept, the bonus token certain); or both come from tied logits through probabilities() with a sampling of their own
    (greedy and top-k make zeros). Each draft is a token its q row gives weight."""
    vocab, k, shape = draw(st.integers(2, 6)), draw(around(1, 3, low=0, high=4)), draw(st.sampled_from(["rows", "all kept", "logits"]))
    if shape != "logits":
        weights = st.lists(st.sampled_from([0.0, 0.0, 1.0, 1.0, 2.0, 3.0]), min_size=vocab, max_size=vocab).filter(lambda w: sum(w) > 0)
        one_hot = st.integers(0, vocab - 1).map(lambda i: [float(j == i) for j in range(vocab)])
        q = [draw(st.one_of(weights, one_hot)) for _ in range(k)]
        if shape == "all kept":  # p = q at every draft: all kept for certain, then a bonus token from p's own last row
            p = q + [draw(one_hot)]
        else:
            p = [q[i] if i < k and draw(st.booleans()) else draw(st.one_of(one_hot, weights)) for i in range(k + 1)]
        source = (torch.tensor(q, dtype=torch.float32).view(k, vocab), torch.tensor(p, dtype=torch.float32))
        source = tuple(rows / rows.sum(dim=1, keepdim=True) for rows in source)
    else:
        logits = draw(tied_logits(rows=(2 * k + 1, 2 * k + 1), vocab=(vocab, vocab)))
        sampling = draw(st.one_of(samplings(), st.builds(SamplingParams, temperature=st.sampled_from([0.5, 1.0, 2.0]),
                                                         top_k=st.integers(0, 3), repetition_penalty=st.sampled_from([1.0, 1.5]))))
        histories = [draw(st.lists(st.integers(0, vocab - 1), max_size=3)) for _ in range(2 * k + 1)]
        source = (logits, sampling, histories)
    return k, vocab, source, draw(st.lists(st.integers(0, 99), min_size=k, max_size=k)), draw(st.integers(0, 2**16))


def read_accepted(out, drafts, q, p):
    """accept_sampled's output as the contract fixes it, whatever the draws: a list of 1 to k + 1 ints, its first tokens
    the drafts kept; how many are kept where that is certain (no draft before the first certain rejection, p = 0 at its
    token, is accepted by chance: p >= q there); the last token where its distribution (the residual max(p - q, 0), p
    itself when that is all 0, or p's last row for the bonus) is one-hot, else whether that distribution gives it weight."""
    k = len(drafts)
    reading = {"type": type(out).__name__, "ints": all(type(t) is int for t in out), "length: 1 to k + 1": 1 <= len(out) <= k + 1}
    if not (reading["ints"] and reading["length: 1 to k + 1"]):
        return reading
    n = len(out) - 1
    reading["the first tokens are the drafts kept"] = list(out[:n]) == list(drafts[:n])
    decided = k  # the number kept, where no chance decides before it
    for i, t in enumerate(drafts):
        if p[i, t] == 0:
            decided = i
            break
        if p[i, t] < q[i, t]:
            decided = None
            break
    reading["drafts kept"] = n if decided is not None else "by chance"
    if n < k:
        dist = (p[n] - q[n]).clamp(min=0)
        dist = dist if dist.sum() > 0 else p[n]
    else:
        dist = p[k]
    last = out[-1]
    reading["last token"] = last if decided is not None and int((dist > 0).sum()) == 1 else bool(0 <= last < len(dist) and dist[last] > 0)
    return reading


def test_7c_differential_accept_sampled(student, seed):
    """accept_sampled against the reference, on distributions with exact zeros and ties (the given probabilities()
    compared too, where the rows come from logits): read_accepted's reading of the output; the arguments unchanged and
    no storage shared with them; with the generator in the same state, the same output again, whatever torch's global
    random state."""
    hint = f"Hint: see {HINTS}, 7c."

    def check(scenario):
        k, vocab, source, picks, g_seed = scenario
        twins = Twins(reference, student, hint=hint, tol=CLOSE)
        if len(source) == 3:  # rows from logits, through the given probabilities()
            logits, sampling, histories = source
            out = twins.call(f"probabilities(logits={logits.tolist()}, {sampling}, histories={histories})",
                             lambda side, x, h: side.probabilities(x, sampling, h), inputs=(logits, histories), again=True)
            q, p = out.reference[:k], out.reference[k:]
        else:
            q, p = source
        drafts = [(q[i] > 0).nonzero().flatten().tolist()[pick % int((q[i] > 0).sum())] for i, pick in enumerate(picks)]
        state = torch.Generator().manual_seed(g_seed).get_state()

        def call(side, d, q, p):
            out = side.accept_sampled(d, q, p, fresh_generator(state))
            torch.manual_seed(g_seed + 1)  # another global random state: the output must not change
            again = side.accept_sampled(list(d), q.clone(), p.clone(), fresh_generator(state))
            return {**read_accepted(out, d, q, p), "the same output again, the generator in the same state": again == out}
        twins.call(f"accept_sampled(draft_tokens={drafts}, draft_probs={q.tolist()}, target_probs={p.tolist()}, "
                   f"generator seeded {g_seed})", call, inputs=(drafts, q, p))

    explore(accept_sampled_scenarios(), check, seed=seed, examples=40, edges=ACCEPT_SAMPLED_EDGES)


# Tried first at every seed (issue 41): no drafts (the bonus token alone, one-hot); p = q at every draft (all kept), the
# bonus one-hot; p = 0 at the draft's token (rejected for certain), the residual one-hot.
ACCEPT_SAMPLED_EDGES = [
    (0, 2, (torch.zeros(0, 2), torch.tensor([[0.0, 1.0]])), [], 0),
    (2, 3, (torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])), [1, 0], 5),
    (1, 2, (torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.5, 0.5]])), [0], 7),
]


class Spy:
    """A draft seen from outside: the k each propose() was asked (when it drafts at all) and how many tokens it returned;
    its forwards are the draft's own."""

    def __init__(self, draft):
        self.inner, self.asked, self.returned = draft, [], []

    @property
    def forwards(self):
        return self.inner.forwards

    def propose(self, context, k, sampling=GREEDY, generator=None):
        tokens, probs = self.inner.propose(context, k, sampling, generator)
        if k or len(tokens):
            self.asked.append(k)
            self.returned.append(len(tokens))
        return tokens, probs


class FixedDraft:
    """A draft without a model, one pretend forward per call: "repeats" proposes the context's last token k times (the
    target rarely agrees); "stops" proposes at most two tokens, the second its stop token, and nothing once the context
    ends with it (fewer than asked, as a draft may return). Its q rows are one-hot."""

    def __init__(self, kind, stop, vocab):
        self.kind, self.stop, self.vocab, self.forwards = kind, stop, vocab, 0

    def propose(self, context, k, sampling=GREEDY, generator=None):
        self.forwards += 1
        if self.kind == "repeats":
            tokens = [context[-1]] * k
        else:
            tokens = [] if context[-1] == self.stop else [(context[-1] + 1) % self.vocab, self.stop][:k]
        return tokens, torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), self.vocab).float().view(len(tokens), self.vocab)


@st.composite
def decoder_scenarios(draw):
    """A target (tiny, or a random model of other sizes and a short context) and a draft: tiny-draft, a random model
    of other sizes again, the target itself (every draft accepted: the bonus token each round), tiny-draft shortlisted,
    or a draft without a model that repeats itself (none accepted) or stops early. A prompt (1 token and more, edge ids
    and <|endoftext|> inside), max_new_tokens (1, 5 and around), k (1, max_new_tokens - 1, itself and one past), a
    sampling, an EOS (the default, none, a token the target produces, one of the prompt's), rounds asked for 1, k, k + 1
    or all that is left, a second decoder stepped in turn (same prompt or another), or speculative_generate whole,
    errors included (k = 0, a request past the context)."""
    config = draw(st.one_of(st.none(), small_config()))
    context = config.n_positions if config else 40
    prompt = draw(prompts(1, 2, min_len=1, max_len=min(12, context - 2)))
    max_new = draw(around(1, 5, low=1, high=min(context - len(prompt), 12)))
    k = draw(st.one_of(st.sampled_from([1, max(max_new - 1, 1), max_new, max_new + 1]), st.integers(1, 5)))
    draft = draw(st.sampled_from(["tiny-draft", "other sizes", "itself", "shortlist", "repeats", "stops"]))
    return {"config": config, "prompt": prompt, "max_new": max_new, "k": k, "draft": draft,
            "draft config": draw(small_config()) if draft == "other sizes" else None,
            "shortlist": draw(st.lists(token_ids(), min_size=1, max_size=40)), "sampling": draw(samplings()),
            "eos": draw(st.sampled_from(["default", "none", "produced", "prompt"])), "eos pick": draw(st.integers(0, 11)),
            "plan": draw(st.lists(st.one_of(st.none(), around(1, k, low=1, high=k + 2)), min_size=1, max_size=3)),
            "second": draw(st.sampled_from([None, "same prompt", "another prompt"])),
            "other prompt": draw(prompts(1, min_len=1, max_len=min(8, context - max_new))),
            "mode": draw(st.sampled_from(["by hand", "by hand", "by hand", "speculative_generate"])),
            "error": draw(st.sampled_from([None, None, None, None, "k = 0", "past the context"]))}


def stats_faults(stats, new, spy, finished, eos, forwards):
    """What the contract says of the statistics and the text, whatever the draws: the sentences it breaks."""
    faults = []
    if type(stats).__name__ != "SpeculativeStats":
        return [f"the statistics are a {type(stats).__name__}, not a SpeculativeStats"]
    if stats.generated != len(new):
        faults.append(f"stats.generated is {stats.generated}, but {plural(len(new), 'token')} came back")
    if eos in new[:-1] or finished != (bool(new) and new[-1] == eos):
        faults.append("the tokens end right after the target's EOS, which finishes the decoder (and nothing else does)")
    if stats.target_forwards != forwards:
        faults.append(f"stats.target_forwards is {stats.target_forwards}, but the target ran {forwards} round(s)")
    if stats.drafted != sum(spy.returned):
        faults.append(f"stats.drafted is {stats.drafted}, but the draft returned {sum(spy.returned)} tokens in all")
    if stats.draft_forwards != spy.forwards:
        faults.append(f"stats.draft_forwards is {stats.draft_forwards}, but the draft's forwards count is {spy.forwards}")
    if not stats.generated - stats.target_forwards <= stats.accepted <= stats.drafted or (
            not finished and stats.accepted != stats.generated - stats.target_forwards):
        faults.append(f"stats.accepted is {stats.accepted}: each round returns the drafts it kept and one token of the "
                      f"target's ({stats.generated} generated in {stats.target_forwards} rounds), and never more than drafted ({stats.drafted})")
    for name, num, den in (("acceptance_rate", stats.accepted, stats.drafted), ("tokens_per_target_forward", stats.generated, stats.target_forwards)):
        value = getattr(stats, name)
        if type(value) is not float or not math.isclose(value, num / den if den else 0.0):
            faults.append(f"stats.{name} is {value!r}, not the float {num / den if den else 0.0!r}")
    return faults


def observe_decoder(side, j, exact):
    """One decoder after a round: the promises it breaks (stats_faults, and the target's cache holding tokens[:-1] but
    after the round that returns the EOS); where the tokens are certain, also its tokens, finished, the target's whole
    cache, the statistics (their class, counts and rates; accepted in the round of the EOS within its bounds only)."""
    dec, spy, prompt = side.decoders[j], side.spies[j], side.prompts[j]
    new = list(dec.tokens[len(prompt):])
    faults = stats_faults(dec.stats, new, spy, dec.finished, side.eos, side.rounds[j])
    if list(dec.tokens[:len(prompt)]) != list(prompt):
        faults.append("self.tokens does not start with the prompt")
    if not dec.finished and len(dec.cache) != len(dec.tokens) - 1:
        faults.append(f"the target's cache holds {plural(len(dec.cache), 'position')}, not len(self.tokens) - 1 = {len(dec.tokens) - 1}")
    reading = {"broken promises": faults}
    if exact:
        s = dec.stats
        reading.update({"tokens": list(dec.tokens), "finished": dec.finished,
                        "target's cache": "free after the EOS" if dec.finished else observe_cache(dec.cache),
                        "stats": record(s, "target_forwards", "drafted", "generated"),
                        "stats.accepted": "within its bounds" if dec.finished else s.accepted,
                        "stats.tokens_per_target_forward": s.tokens_per_target_forward})
    return reading


def make_draft(module, scenario, target, draft_model):
    kind, vocab = scenario["draft"], target.config.vocab_size
    if kind in ("repeats", "stops"):
        return FixedDraft(kind, scenario["eos id"] if scenario["eos id"] >= 0 else 0, vocab)
    model = {"tiny-draft": draft_model, "itself": target, "shortlist": draft_model}.get(kind) or small_model(scenario["draft config"], target.device, seed=1)
    if kind == "shortlist":
        model = module.shortlist(draft_model, sorted(set(scenario["shortlist"] + scenario["prompt"])))
    return module.DraftModel(model)


def test_7e_differential_decoder(student, model, draft_model, seed):
    """SpeculativeDecoder stepped by hand against the reference (and speculative_generate whole), drafts of every kind,
    with every sampling: after construction and after EVERY round of each decoder (two of them stepped in turn), the
    round's tokens, the target forwards it ran (one), the k the draft was asked for (min(k, max_tokens - 1), none for
    max_tokens 1), and observe_decoder's reading of both decoders. With real sampling, where yours may draw other tokens
    than the reference's, the promises themselves, and a second decoder of the same seed stepped alike holding the same
    tokens."""
    hint = f"Hint: see {HINTS}, 7e (and 7a-7d for the parts it uses)."

    def check(sc):
        target = small_model(sc["config"], model.device) if sc["config"] else model
        sampling, prompt, max_new, k = sc["sampling"], sc["prompt"], sc["max_new"], sc["k"]
        exact = certain(sampling)
        text = penalized_greedy(target, tuple(prompt), max_new, sampling.repetition_penalty)
        sc["eos id"] = {"default": reference.EOS_TOKEN_ID, "none": -1, "produced": text[min(sc["eos pick"], max_new - 1)],
                        "prompt": prompt[sc["eos pick"] % len(prompt)]}[sc["eos"]]
        if sc["error"] == "k = 0":
            k = 0
        elif sc["error"] == "past the context":
            max_new = target.config.n_positions - len(prompt) + 1
        twins = Twins(reference, student, hint=hint, tol=CLOSE,
                      log=[f"target = {describe(target)}; draft: {sc['draft']}; prompt={prompt}; k={k}; {sampling}; eos_token_id={sc['eos id']}"])
        if sc["mode"] == "speculative_generate" or sc["error"]:
            return generate(twins, sc, target, prompt, max_new, k, exact)
        second = sc["second"] if exact else "same prompt"  # real sampling: the second decoder has the same seed, as a witness
        prompts_ = [prompt] + ([prompt if second == "same prompt" else sc["other prompt"]] if second else [])

        def build(module):
            spies = [Spy(make_draft(module, sc, target, draft_model)) for _ in prompts_]
            decoders = [module.SpeculativeDecoder(target, spy, p, k, sampling, sc["eos id"]) for spy, p in zip(spies, prompts_)]
            return types.SimpleNamespace(decoders=decoders, spies=spies, prompts=prompts_, eos=sc["eos id"], rounds=[0] * len(prompts_),
                                         known=[0] * len(prompts_))

        def observe(side):
            readings = [observe_decoder(side, j, exact) for j in range(len(prompts_))]
            if not exact and side.rounds[0] == side.rounds[1]:
                readings.append({"the decoder of the same seed, stepped alike, holds the same tokens": side.decoders[0].tokens == side.decoders[1].tokens})
            return read(readings)
        names = ["decoder", "second"]
        sides = twins.call(f"decoder = SpeculativeDecoder(target, draft, prompt, k={k}, sampling, eos_token_id)"
                           + (f"; second = another with prompt={prompts_[1]}" if second else ""), lambda module: build(module),
                           returns=None, observe=observe)

        def left(side, j):
            return 0 if side.decoders[j].finished else max_new - (len(side.decoders[j].tokens) - len(prompts_[j]))

        def step(side, j, ask):
            dec, spy = side.decoders[j], side.spies[j]
            calls, before, length = len(spy.asked), spy.forwards, len(dec.tokens)
            drafter = None if sc["draft"] == "itself" else getattr(spy.inner, "model", None)  # the draft's own model, if any
            with contextlib.ExitStack() as counting:
                work = counting.enter_context(count_model_work(target))
                drafted = counting.enter_context(count_model_work(drafter)) if drafter is not None else None
                got = dec.step(ask)
            side.rounds[j] += 1
            ran = work.forward_passes - (spy.forwards - before if sc["draft"] == "itself" else 0)
            broken = [] if (type(got) is list and all(type(t) is int for t in got) and 1 <= len(got) <= min(k + 1, ask)) else [
                f"step({ask}) returned {got!r}: a list of 1 to min(k + 1, max_tokens) = {min(k + 1, ask)} ints"]
            if len(spy.asked) > calls:  # the draft ran: over what its cache could not hold (the text of its last call and
                allowed = length - side.known[j] + spy.asked[-1] + 1  # the drafts kept then), and its drafts
                if drafter is not None and drafted.tokens > allowed:
                    broken.append(f"the draft ran {drafted.tokens} positions in step({ask}); its cache could hold {side.known[j]} of the "
                                  f"{length} tokens of the text, so at most {allowed}: never the prompt again (7a)")
                side.known[j] = len(dec.tokens) - 1
            reading = {"target forwards in the round": ran, "the draft was asked for": spy.asked[calls:], "broken promises": broken}
            return {**reading, "returned": got} if exact else reading
        for i in range(max_new + 1):
            for j in range(len(prompts_)):
                if exact:  # the same rounds on both sides: the reference's decide
                    ask = min(sc["plan"][i % len(sc["plan"])] or max_new, left(sides.reference, j))
                    if ask:
                        sides.call(f"{names[j]}.step({ask})", lambda side, j=j, ask=ask: step(side, j, ask))
                elif left(sides.reference, j) or left(sides.student, j):  # each side steps while it has tokens to make

                    def maybe(side, j=j, i=i):
                        ask = min(sc["plan"][i % len(sc["plan"])] or max_new, left(side, j))
                        return step(side, j, ask)["broken promises"] if ask else []
                    sides.call(f"{names[j]}.step(min({sc['plan'][i % len(sc['plan'])] or max_new}, what is left)) while it has tokens to make", maybe)

    def generate(twins, sc, target, prompt, max_new, k, exact):
        def run(module):
            spy = Spy(make_draft(module, sc, target, draft_model))
            before = 0
            with count_model_work(target) as work:
                tokens, stats = module.speculative_generate(target, spy, prompt, max_new, k, sc["sampling"], sc["eos id"])
            ran = work.forward_passes - (spy.forwards - before if sc["draft"] == "itself" else 0)
            finished = bool(tokens) and tokens[-1] == sc["eos id"]
            faults = stats_faults(stats, list(tokens), spy, finished, sc["eos id"], ran)
            if not (len(tokens) == max_new or finished):
                faults.append(f"{plural(len(tokens), 'token')} came back, neither max_new_tokens ({max_new}) nor ending at the EOS")
            if exact:
                return {"tokens": tokens, "stats": record(stats, "target_forwards", "drafted", "generated"),
                        "stats.accepted": "within its bounds" if finished else stats.accepted, "broken promises": faults}
            again, _ = module.speculative_generate(target, Spy(make_draft(module, sc, target, draft_model)), prompt, max_new, k,
                                                   sc["sampling"], sc["eos id"])
            return {"broken promises": faults, "the same tokens again, from the same seed": again == tokens}
        twins.call(f"speculative_generate(target, draft, prompt, max_new_tokens={max_new}, k={k}, sampling, eos_token_id)", run)

    explore(decoder_scenarios(), check, seed=seed, examples=25, edges=DECODER_EDGES)


def decoder_edge(**changes):
    """A named edge as decoder_scenarios draws one: a 16-position target, greedy, stepped by hand, no error."""
    return {"config": _CONTEXT_16, "prompt": list(range(100, 110)), "max_new": 6, "k": 7, "draft": "itself", "draft config": None,
            "shortlist": [0], "sampling": GREEDY, "eos": "none", "eos pick": 0, "plan": [None], "second": None, "other prompt": [0],
            "mode": "by hand", "error": None, **changes}


# Tried first at every seed (issue 41): the target as its own draft (every draft kept), k one past max_new_tokens, the
# context filled to its last position, beside a second decoder on a one-token prompt; a draft that repeats itself (none
# kept) on a prompt of EOS alone, the EOS the first token produced, rounds of 1.
DECODER_EDGES = [
    decoder_edge(second="another prompt"),
    decoder_edge(draft="repeats", prompt=[50256], max_new=5, k=5, eos="produced", plan=[1], second="same prompt"),
]


@st.composite
def jacobi_scenarios(draw):
    """A target (tiny, or a random model of other sizes and a short context), a prompt, max_new_tokens (1, 4 and around,
    up to the context's edge on a short context, and past it: an error), n at 1, 2, max_new_tokens and around, an EOS
    (the default, none, a token the target produces, one of the prompt's)."""
    config = draw(st.one_of(st.none(), small_config()))
    context = config.n_positions if config else 40
    prompt = draw(prompts(1, 2, min_len=1, max_len=min(12, context - 1)))
    left = context - len(prompt)
    max_new = draw(around(1, 4, left, low=1, high=min(left + 1, 14)) if config else around(1, 4, low=1, high=14))
    n = draw(st.one_of(st.sampled_from([1, 2, max(max_new - 1, 1), max_new, max_new + 1]), st.integers(1, 6)))
    return config, prompt, max_new, n, draw(st.sampled_from(["default", "none", "produced", "prompt"])), draw(st.integers(0, 13))


def test_7f_differential_jacobi(student, model, seed):
    """jacobi_generate against the reference: the tokens (greedy, near ties tolerated), stats.generated and
    draft_forwards, and what the forwards ran against the contract (check_jacobi_work: the window, the statistics, no
    forward after the EOS); the prompt unchanged; the error where the reference raises one. (How many guesses come true
    depends on the guesses, free to choose: accepted and target_forwards are checked against the work, not the reference.)"""
    hint = f"(see {HINTS}, 7f)"

    def check(scenario):
        config, prompt, max_new, n, eos_kind, pick = scenario
        m = small_model(config, model.device) if config else model
        text = greedy(m, tuple(prompt), max_new) if len(prompt) + max_new <= m.config.n_positions else [0]
        eos = {"default": reference.EOS_TOKEN_ID, "none": -1, "produced": text[min(pick, len(text) - 1)], "prompt": prompt[pick % len(prompt)]}[eos_kind]

        def run(side, p):
            with Forwards(m) as forwards:
                got, stats = side.jacobi_generate(m, p, max_new, n=n, eos_token_id=eos)
            try:
                check_jacobi_work(stats, got, forwards, p, max_new, n, -1 if eos not in got else eos, hint)
                if eos in got and got[-1] == eos and forwards.at(len(forwards) - 1) is not None:
                    assert len(p) + len(got) - 2 in forwards.at(len(forwards) - 1), f"a forward ran after the one that produced the EOS {hint}."
                work = "as the contract says"
            except AssertionError as failure:
                work = str(failure)
            return {"new tokens": GreedyTokens(got, m, tuple(p)), "stats": record(stats, "generated", "draft_forwards"), "the work": work}
        Twins(reference, student, hint=f"Hint: see {HINTS}, 7f.").call(
            f"jacobi_generate(target={describe(m)}, prompt={prompt}, max_new_tokens={max_new}, n={n}, eos_token_id={eos})",
            run, inputs=(prompt,))

    explore(jacobi_scenarios(), check, seed=seed, examples=20, edges=JACOBI_EDGES)


# Tried first at every seed (issue 41): the context filled to its last position with n one past max_new_tokens; a
# one-token prompt (id 0) whose first new token is the EOS, n = 1; one past the context (refused).
JACOBI_EDGES = [
    (_CONTEXT_16, list(range(100, 110)), 6, 7, "none", 0),
    (_CONTEXT_16, [0], 15, 1, "produced", 0),
    (_CONTEXT_16, [5] * 10, 7, 2, "default", 0),
]
