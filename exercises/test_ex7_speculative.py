"""Checker for exercise 7, speculative decoding: pytest exercises/test_ex7_speculative.py

Parts are graded on their own (-k 7a, -k 7b, ...). Greedy speculative decoding must return exactly the
target's greedy tokens; rejection sampling is checked on hand-built distributions against the
distribution it must produce (chi-square and binomial tests at significance 1e-5 each: a correct
implementation fails this checker less than once in 10,000 runs); scripted drafts that disagree where
we choose check the acceptance rule and the counters; the target's cache is compared after each round.
"""

import copy
import functools
import math
import random

import pytest
import torch

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
)
from workshop.serving.sampling import GREEDY, SamplingParams, filter_logits
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex7.md"
SIGNIFICANCE = 1e-5  # per statistical check; the checker has 6 of them, so a correct implementation fails < 1e-4
Z_LIMIT = 4.42  # two-sided normal quantile for 1e-5


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
        with pytest.raises(ValueError):
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
            assert problem is None, (f"propose(context of {len(context)} tokens, k={k}) is not the draft's greedy continuation: stale "
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
    assert stats.generated == len(got), f"stats.generated is {stats.generated}, but {len(got)} tokens came back {hint}."
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
                f"after {len(got)} tokens (k={k}): step({wanted}) asked the draft for {asked} tokens; at most {wanted} tokens can "
                f"come back, the last of them the target's own, so a round drafts at most max_tokens - 1 = {wanted - 1}: never "
                f"draft what could not be returned (and with max_tokens = 1, draft nothing) {hint}.")
            assert work.forward_passes == 1 and work.tokens <= uncached + wanted - 1, (
                f"step({wanted}) ran {work.forward_passes} target forwards over {work.tokens} tokens; one forward over the "
                f"{uncached} uncached token(s) and at most {wanted - 1} drafts {hint}.")
            assert len(new) == min(wanted, k + 1), (
                f"step({wanted}) with a draft that is always right returned {len(new)} tokens; expected min(max_tokens, k + 1) = "
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
                f"after a round, the accepted text is {len(tokens)} tokens; the target's cache must hold all but the last, "
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
    call = f"jacobi_generate(prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens}, n={n_guess}, eos_token_id={eos})"
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
    assert stats.generated == len(got), f"{call}: stats.generated is {stats.generated}, but {len(got)} tokens came back {hint}."
    assert stats.target_forwards == len(forwards) <= len(got), (
        f"{call}: stats.target_forwards is {stats.target_forwards}; counted {len(forwards)} forwards of the target for "
        f"{len(got)} tokens (each forward returns at least one) {hint}.")
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
            f"{len(forwards)} forwards for {len(got)} tokens on a model whose predictions depend on positions only: no guess "
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
                f"jacobi_generate(n={n_guess}), prompt of {len(prompt)} tokens: forward {i} kept {kept[i]} of its {guessed[i]} "
                f"guesses, and predicted the {guessed[i] - kept[i]} positions after the tokens it kept; on this model a "
                f"prediction is right whatever came before it, yet forward {i + 1} kept only {kept[i + 1]} of its "
                f"{guessed[i + 1]} guesses. After a mismatch every guess past it is replaced by the forward's new predictions: "
                f"the old ones were made from a text now known wrong {hint}.")
