"""workshop/serving/sampling.py, the engines' batched sampler: row by row the token a plain rule gives
(exercise 6's filter_logits, softmax, a cumulative sum over the whole vocabulary, searchsorted at the
generator's next uniform) over sequences of calls where rows join, leave, come back and switch between
greedy and sampled; a row's token depends on its logits, parameters and generator only; the caller's
logits are left alone; the draws follow the distribution and never pick a token of probability 0; and a
steady step costs a few ATen ops and no host read.

    pytest tests/test_sampler.py
"""

import random
import threading

import pytest
import torch

import solutions.ex6_decoding as ex6
from workshop.host_reads import HostReads
from workshop.replay import aten_ops, op_counts
from workshop.serving import sampling
from workshop.serving.sampling import AHEAD, GREEDY, SamplingParams, filter_logits, make_generator, sample, sample_ids

U_MAX = 1 - 2 ** -23  # the largest uniform the sampler uses, written out: the reference below is plain


def reference_token(logits, params, generator, history):
    """One row's token by the plain rule: exercise 6's processors, softmax, the whole cumulative sum, and
    the first token whose sum exceeds u x total, u the generator's next float64 draw as float32 <= U_MAX."""
    x = ex6.filter_logits(logits[None], [params], [history])
    if params.greedy:
        return int(x.argmax())
    cdf = x.softmax(dim=1).cumsum(dim=1)
    u = torch.rand(1, generator=generator, dtype=torch.float64).float().clamp(max=U_MAX)
    return int(torch.searchsorted(cdf, (u * cdf[:, -1]).view(1, 1), right=True))


def random_params(rng, vocab, greedy=None):
    if greedy if greedy is not None else rng.random() < 0.25:  # a greedy row's other processors change nothing
        return SamplingParams(temperature=0.0, repetition_penalty=rng.choice([1.0, 1.0, 1.3]), top_p=rng.choice([1.0, 0.5]),
                              top_k=rng.choice([0, vocab + 1, 3]))
    return SamplingParams(temperature=rng.choice([0.5, 1.0, 1.0, 1.7]), top_k=rng.choice([0, 0, 1, 2, 5, vocab - 1, vocab, vocab + 3]),
                          top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 0.01]), min_p=rng.choice([0.0, 0.0, 0.05, 0.3, 1.0]),
                          repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.7]), seed=rng.randrange(-2**63, 2**64))


def random_logits(rng, rows, vocab):
    """Normal logits at a random scale (at 50, tokens of probability exactly 0 in float32); sometimes rounded
    (exact ties), sometimes with -inf tails or holes (at least one finite logit a row)."""
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rng.randrange(2**32))) * rng.choice([0.3, 2.0, 20.0, 50.0])
    if rng.random() < 0.3:
        x = x.round()
    for row in range(rows):
        if rng.random() < 0.3:  # a tail of -inf, the last token included
            x[row, rng.randrange(1, vocab + 1):] = -float("inf")
        if rng.random() < 0.2:
            x[row, [rng.randrange(vocab) for _ in range(vocab // 2)]] = -float("inf")
            x[row, rng.randrange(vocab)] = rng.uniform(-3, 3)
    return x


class Request:
    """A row's request: its parameters, the generator the sampler gets and its twin (same seed) for the
    reference, its history. A sibling shares its parent's generators (its draws come in row order)."""

    def __init__(self, rng, vocab, parent=None):
        self.params = random_params(rng, vocab)
        if parent is None:
            seed = rng.randrange(2**32)
            self.generator, self.twin = make_generator(seed), make_generator(seed)
        else:
            self.generator, self.twin = parent.generator, parent.twin
        self.history = [rng.randrange(vocab) for _ in range(rng.choice([0, 1, 3, 8]))]


def run_scenario(seed, calls=30):
    """A sequence of calls over requests that join, leave, come back, switch between greedy and sampled,
    change order, share a generator; now and then a caller keeps a row's token back, adds one more, or
    replaces it (after sample(), which knows the tokens it gave). Every row is checked against
    reference_token, and the state must be reused exactly when the call continues the last one: the same
    rows and parameters, every penalised row's history grown by the token it was given."""
    rng = random.Random(seed)
    vocab = rng.choice([1, 2, 7, 64, 300, 1000])
    pool = [Request(rng, vocab) for _ in range(rng.randint(1, 6))]
    rows = rng.sample(pool, rng.randint(1, len(pool)))
    last, reused = None, 0  # last: (rows, params) of the last call through the state, while the next may continue it
    for call in range(calls):
        change = rng.random()
        if call and change < 0.55:
            pass  # the same rows, one token further: the state continues
        elif change < 0.65:
            rows = rows + [rng.choice([r for r in pool if r not in rows] or [Request(rng, vocab)])]  # joins or comes back
        elif change < 0.72:
            sibling = Request(rng, vocab, parent=rng.choice(rows))
            rows = rows[:] + [sibling]
            rng.shuffle(rows)
        elif change < 0.82 and len(rows) > 1:
            leaving = rng.choice(rows)
            rows = [r for r in rows if r is not leaving]  # it may come back
        elif change < 0.9:
            rng.choice(rows).params = random_params(rng, vocab, greedy=rng.random() < 0.5)  # greedy <-> sampled
        else:
            rows = rng.sample(rows, len(rows))
        pool += [r for r in rows if r not in pool]
        params = [r.params for r in rows]
        logits = random_logits(rng, len(rows), vocab)
        before = logits.clone()
        state = getattr(sampling._local, "batch", None)
        fast = all(p.greedy and p.repetition_penalty == 1 for p in params)  # the argmax, no state
        by_list = rng.random() < 0.5
        args = (logits, params, [r.generator for r in rows], [list(r.history) for r in rows])
        tokens = sample(*args) if by_list else sample_ids(*args).tolist()
        assert torch.equal(logits, before), "the sampler changed the caller's logits"
        if not fast and last is not None:
            continues = last == ([id(r) for r in rows], params)
            assert (sampling._local.batch is state) == continues, (
                f"seed {seed}, call {call}: the state was {'rebuilt' if continues else 'reused'}, but the call "
                f"{'continues' if continues else 'does not continue'} the last one")
            reused += continues
        for i, (r, token) in enumerate(zip(rows, tokens)):
            expected = reference_token(logits[i], r.params, r.twin, r.history)
            assert token == expected, (f"seed {seed}, call {call}, row {i} of {len(rows)} ({r.params}, history {r.history}): "
                                       f"{token}, the plain rule gives {expected}")
            r.history.append(token)
        if not fast:
            last = ([id(r) for r in rows], params)
        if rng.random() < 0.15:  # the caller changes a history: the next call must not continue a penalised row
            r = rng.choice(rows)
            how = rng.choice(["keep back", "one more"] + ["replace"] * by_list)  # sample_ids' caller must add what it gave
            if how == "keep back":
                r.history.pop()
            elif how == "one more":
                r.history.append(rng.randrange(vocab))
            elif r.history[-1] != (forced := (r.history[-1] + 1) % vocab):
                r.history[-1] = forced
            else:
                how = None
            if how and r.params.repetition_penalty != 1 and last is not None:
                last = "a penalised history changed"  # the next call must rebuild
    return reused


@pytest.mark.parametrize("seed", range(12))
def test_each_row_gets_the_plain_rules_token_as_rows_join_leave_and_come_back(seed):
    run_scenario(seed)


def test_the_state_is_reused_while_the_same_rows_come_back():
    assert sum(run_scenario(seed, calls=20) for seed in range(100, 104)) > 10


def test_a_row_samples_the_same_whatever_the_batch():
    rng = random.Random(0)
    logits = torch.randn(12, 50257, generator=torch.Generator().manual_seed(1)) * 2
    params = [GREEDY if i % 4 == 0 else SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0, 1.3]), top_k=rng.choice([0, 40]),
                                                       top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.05]),
                                                       repetition_penalty=rng.choice([1.0, 1.3]), seed=i) for i in range(12)]
    histories = [[rng.randrange(50257) for _ in range(rng.randrange(1, 20))] for _ in range(12)]
    before = logits.clone()
    batch = sample(logits, params, [make_generator(p.seed) for p in params], histories)
    assert torch.equal(logits, before), "sample() changed the caller's logits"
    for i in range(12):
        alone = sample(logits[i:i + 1].clone(), [params[i]], [make_generator(params[i].seed)], [histories[i]])
        assert alone == [batch[i]], f"row {i} ({params[i]}): {batch[i]} in the batch, {alone[0]} alone"


@pytest.mark.parametrize("seed", range(4))
def test_filter_logits_equals_exercise_6s(seed):
    rng = random.Random(seed)
    for trial in range(40):
        vocab = rng.choice([1, 2, 5, 64, 1000])
        rows = rng.randint(1, 6)
        logits = random_logits(rng, rows, vocab)
        params = [random_params(rng, vocab) for _ in range(rows)]
        histories = [[rng.randrange(vocab) for _ in range(rng.randint(0, 6))] for _ in range(rows)]
        before = logits.clone()
        got, expected = filter_logits(logits, params, histories), ex6.filter_logits(logits, params, histories)
        assert torch.equal(logits, before), "filter_logits changed the caller's logits"
        assert got.data_ptr() != logits.data_ptr(), "filter_logits returned the caller's tensor"
        assert torch.equal(got, expected), f"seed {seed}, trial {trial}, {params}: not exercise 6's filtered logits"


def test_n_draws_at_once_are_n_draws_one_by_one():
    """What drawing ahead relies on: a generator's stream does not depend on how it is cut."""
    for n in (1, AHEAD - 1, AHEAD, AHEAD + 1, 5000):
        at_once = torch.rand(n, generator=make_generator(n), dtype=torch.float64)
        one_by_one = make_generator(n)
        assert torch.equal(at_once, torch.cat([torch.rand(1, generator=one_by_one, dtype=torch.float64) for _ in range(n)])), n


def test_the_largest_uniform_keeps_the_target_below_the_total():
    """The proof next to U_MAX, on float32 totals across binades (powers of two and their neighbours
    included): float32(U_MAX x T) < T. Without the clamp, a float64 draw just below 1 is 1.0 in float32."""
    totals = torch.cat([torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 4,
                        2.0 ** torch.arange(-20, 20).float(), torch.nextafter(2.0 ** torch.arange(-20, 20).float(), torch.tensor(0.0))])
    assert (torch.tensor(U_MAX, dtype=torch.float32) * totals < totals).all()
    assert torch.tensor(1 - 2 ** -30, dtype=torch.float64).float() == 1.0


def test_a_token_of_probability_0_is_never_drawn():
    """Draws at 0, just below 1 (1.0 once in float32: the clamp's case), at U_MAX and near it, on rows whose
    last tokens (and holes) are -inf or whose tail weighs less than one float32 step of the total: every
    token drawn has probability > 0 and lies inside the row."""
    rng = random.Random(0)
    extremes = torch.tensor([0.0, 1 - 2 ** -30, 1 - 2 ** -53, U_MAX, 1 - 2 ** -22, 0.5, 1e-9], dtype=torch.float64)
    for vocab in (2, 3, 64, 50257):
        logits = random_logits(rng, 16, vocab)
        logits[:8, -1] = -float("inf")
        logits[8:] = logits[8:].clamp(max=1.0) - 30.0
        logits[8:, 0] = 0.0  # the rest weighs less than one float32 step of the total: the sum stops growing
        params = [SamplingParams(seed=i, temperature=rng.choice([0.5, 1.0])) for i in range(16)]
        generators = [make_generator(i) for i in range(16)]
        for g in generators:  # the generators' next draws, as if drawn ahead
            stream = sampling._stream(g)
            stream.numbers, stream.start, stream.used = extremes.repeat(AHEAD), 0, 0
        probs = ex6.filter_logits(logits, params).softmax(dim=1)
        for _ in range(len(extremes)):
            token = sample_ids(logits, params, generators)
            assert ((token >= 0) & (token < vocab)).all() and (probs.gather(1, token.view(-1, 1)) > 0).all(), vocab
    for seed in range(3):  # and by the generators' own draws, many of them
        logits = random_logits(random.Random(seed), 32, 5)
        logits[:, -1] = -float("inf")
        generators = [make_generator(seed * 100 + i) for i in range(32)]
        probs = logits.softmax(dim=1)
        for _ in range(200):
            token = sample_ids(logits, [SamplingParams(seed=0)] * 32, generators)
            assert (probs.gather(1, token.view(-1, 1)) > 0).all()


def chi_square_p(counts, probs):
    """The p-value of counts against probabilities (tokens of probability > 0), by the regularised upper
    incomplete gamma function: how often a correct sampler is at least this far off."""
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=6, top_p=0.95, min_p=0.01)])
def test_the_draws_follow_the_distribution(params):
    """8 rows of the same logits, each with its own generator, 600 steady steps (the uniform windows refilled
    along the way): counts against the filtered distribution, at p > 1e-5 (the course's checker's level)."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 1.5, -float("inf"), 0.5, 0.2, -1.0, 1.1, 0.9]]).expand(8, -1).contiguous()
    probs = ex6.filter_logits(logits[:1], [params]).softmax(dim=1)[0].double()
    generators = [make_generator(i) for i in range(8)]
    counts = torch.zeros(10, dtype=torch.float64)
    for _ in range(600):
        counts += torch.bincount(sample_ids(logits, [params] * 8, generators), minlength=10)
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was drawn"
    assert chi_square_p(counts, probs) > 1e-5, (counts / counts.sum()).tolist()


def test_a_row_that_leaves_continues_its_stream_when_it_comes_back():
    """Row A's tokens alone, then with B, then without, then with B again: each is A's next draw."""
    logits = torch.zeros(1, 1024)  # uniform over 1024: the token is u x 1024, rounded down
    a, b = make_generator(1), make_generator(2)
    twin = make_generator(1)
    calls = [[a], [a], [b, a], [b, a], [b], [a], [a, b]]
    for rows in calls:
        tokens = sample(logits.expand(len(rows), -1), [SamplingParams()] * len(rows), rows)
        if a in rows:
            u = torch.rand(1, generator=twin, dtype=torch.float64).float().clamp(max=U_MAX)
            assert tokens[rows.index(a)] == int(u * 1024), f"calls {calls}: at {rows} row A did not draw its generator's next uniform"


def test_threads_keep_their_own_state_and_share_the_streams():
    """Another thread's call leaves this thread's state alone; when it draws from one of this state's
    generators (the host counters show it), the state is rebuilt and the row takes its next draw."""
    logits, params = torch.zeros(2, 1024), [SamplingParams()] * 2
    a, b, twin = make_generator(1), make_generator(2), make_generator(1)
    a_draws = []

    def a_token(tokens):  # the token is u x 1024 rounded down: one of A's draws
        a_draws.append(torch.rand(1, generator=twin, dtype=torch.float64).float().clamp(max=U_MAX))
        assert tokens[0] == int(a_draws[-1] * 1024), "row A did not take its generator's next draw"

    a_token(sample(logits, params, [a, b]))
    mine = sampling._local.batch
    other = threading.Thread(target=sample, args=(torch.randn(2, 100), params, [make_generator(9), make_generator(8)]))
    other.start(), other.join()
    a_token(sample(logits, params, [a, b]))
    assert sampling._local.batch is mine, "another thread's call replaced this thread's state"
    other = threading.Thread(target=lambda: a_token(sample(logits[:1], params[:1], [a])))
    other.start(), other.join()
    a_token(sample(logits, params, [a, b]))
    assert sampling._local.batch is not mine and len(a_draws) == 4, "A drew in another thread: the state must be rebuilt"


def test_bad_calls_get_one_clear_sentence():
    logits = torch.randn(2, 10)
    with pytest.raises(ValueError, match="one SamplingParams per row"):
        sample(logits, [SamplingParams()], [make_generator(0)])
    with pytest.raises(ValueError, match="history"):
        sample(logits, [SamplingParams(repetition_penalty=1.2)] * 2, [make_generator(0)] * 2)
    with pytest.raises(ValueError, match="no generator"):
        sample(logits, [SamplingParams()] * 2, [make_generator(0), None])
    assert sample(logits, [GREEDY] * 2, [None, None]) == logits.argmax(dim=1).tolist()  # a greedy row needs none


# ----------------------------------------------------------------------------------------------
# What a step costs. ATen ops (views included, as workshop.replay counts them) of one steady call at batch
# 32, every row sampled at temperature 1: BASE. Each processor a row uses adds its own (PROCESSOR_OPS).
# Before this sampler (a torch.rand per row, a two-level inverse CDF): 92 ops and 3 host reads + .tolist().

BASE = 8  # softmax, cumsum_, gather (the uniforms), add_ (their index), slice (the total), mul, searchsorted, view
PROCESSOR_OPS = {
    "temperature": 1,  # div (a temperature neither 0 nor 1)
    "greedy rows": 2,  # argmax, where (greedy and sampled rows in one batch)
    "top-k": 4,  # topk (of the largest k only), gather, lt, masked_fill
    "top-p": 10,  # sort, softmax, cumsum, le, masked_fill, amin, slice, minimum, lt, masked_fill
    "min-p": 5,  # softmax, amax, mul, lt, masked_fill
    "penalty": 6,  # scatter_ (last step's tokens into the seen mask), lt, mul, div, where, where
}


def steady_call(params, vocab=50257, rows=32):
    """(ops, host reads) of the second of two calls with the same rows, each history one token longer."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    generators = [make_generator(i) for i in range(rows)]
    histories = [[i, 7] for i in range(rows)]
    with HostReads() as first:
        tokens = sample_ids(logits, params, generators, histories)
    histories = [h + [t] for h, t in zip(histories, tokens.tolist())]
    with HostReads() as reads:
        _, ops = aten_ops(sample_ids, logits, params, generators, histories)
    assert first.count == 0, f"the first call (the state built) read the device: {first.reads}"
    return op_counts(ops)["aten_ops"], reads.reads


def test_a_steady_step_at_batch_32_costs_a_few_ops_and_no_host_read():
    ops, reads = steady_call([SamplingParams(seed=i) for i in range(32)])
    assert ops == BASE <= 15 and reads == [], (ops, reads)


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("top_k", [0, 40])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("min_p", [0.0, 0.05])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_every_processor_costs_its_ops_and_no_host_read(greedy, top_k, top_p, min_p, penalty):
    params = [GREEDY if greedy and i % 2 else SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p,
                                                             repetition_penalty=penalty, seed=i) for i in range(32)]
    ops, reads = steady_call(params, vocab=1000)
    used = ["temperature", "greedy rows" if greedy else None, "top-k" if top_k else None, "top-p" if top_p < 1 else None,
            "min-p" if min_p else None, "penalty" if penalty != 1 else None]
    assert reads == [], reads
    assert ops == BASE + sum(PROCESSOR_OPS[name] for name in used if name), (used, ops)


def test_sample_reads_the_device_once():
    params, generators = [SamplingParams(seed=i) for i in range(8)], [make_generator(i) for i in range(8)]
    logits = torch.randn(8, 100)
    sample(logits, params, generators)
    with HostReads() as reads:
        sample(logits, params, generators)
    assert reads.reads == ["tolist"], reads.reads


def test_the_draws_live_on_the_generator_on_every_torch():
    """torch before 2.13 (what GPU images ship: 2.11) takes no weak reference to a torch.Generator, so the streams
    cannot be a WeakKeyDictionary keyed by generators (every sampled step raised TypeError on an H200). The
    generators of make_generator carry their stream, a copy draws what the original would, and a generator that
    can hold no stream gets one clear sentence."""
    import copy
    import pickle

    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=1.0)]
    generator = make_generator(3)
    assert isinstance(generator, sampling.StreamGenerator) and isinstance(generator, torch.Generator)
    sample(logits, params, [generator])  # draws AHEAD ahead: the stream holds the rest
    twin, thawed = copy.deepcopy(generator), pickle.loads(pickle.dumps(generator))
    expected = [sample(logits, params, [generator]) for _ in range(3)]
    for other in (twin, thawed):
        assert [sample(logits, params, [other]) for _ in range(3)] == expected

    class NoWeakReference:  # torch 2.11's torch.Generator, as far as the streams can tell
        __slots__ = ()

    with pytest.raises(ValueError, match="make_generator"):
        sampling._stream(NoWeakReference())
