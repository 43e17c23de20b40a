"""Checker for exercise 12, piecewise graphs and fusion: pytest exercises/test_ex12_piecewise_graphs.py (-k 12a, 12b, 12c)

Graded on a CPU by invariants, as module 11: exercise 5's forward and engine are the oracle (the same logits,
tokens and KV pool), a piece must run the same kernels whatever its buffers hold (workshop.graphs.trace), the
CPU stand-in of workshop/graphs.py replays what was captured (a value copied anywhere else is never seen), and
each engine step must run in the mode the contract says. 12c compiles with Inductor's C++ backend: the first
compile of a session takes tens of seconds (a C++ compiler builds each fused kernel; Inductor caches them on disk,
so a second run takes a few), which is why its checks use one small model throughout.
"""

import copy
import random
import shutil
import time

import pytest
import torch
from hypothesis import strategies as st

import gpt
import solutions.ex12_piecewise_graphs as reference
import solutions.ex5_paged_kv_cache as paged
from workshop import graphs
from workshop.grading.differential import GreedyTokens, Tolerance, Twins, explore, read, tolerance
from workshop.grading.harness import compare_tokens, implementation
from workshop.grading.scenarios import around, dtype_name, dtypes, small_config, small_model, token_ids
from workshop.grading.wording import plural
from workshop.serving.sampling import SamplingParams
from workshop.serving.workloads import mixed_workload

HINTS = "exercises/hints/ex12.md"
NO_EOS = -1
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "12a": ["StepInputs.fill", "run_piece", "piecewise_forward"],
    "12b": ["PiecewiseGraphs.capture", "PiecewiseGraphs.run", "Engine.__init__", "Engine.run_model"],
    "12c": ["compile_piece"],
}
DIFFERENTIAL_API = {  # each public name of the stub -> the check that runs it against the reference
    "token_capture_sizes": "test_12a_differential_fill", "StepInputs": "test_12a_differential_fill",
    "StepInputs.fill": "test_12a_differential_fill", "run_piece": "test_12a_differential_forward",
    "attend": "test_12a_differential_forward", "piecewise_forward": "test_12a_differential_forward",
    "PiecewiseGraphs": "test_12b_differential_graphs", "PiecewiseGraphs.capture": "test_12b_differential_graphs",
    "PiecewiseGraphs.run": "test_12b_differential_graphs", "Engine": "test_12b_differential_engine",
    "Engine.run_model": "test_12b_differential_engine", "generate": "test_12b_differential_engine",
    "compile_piece": "test_12c_differential",
}
LOGITS = Tolerance(1e-4, 1e-4)  # fp32 logits of a small model: another order of additions (a padded matmul, another kernel)
COMPILED = Tolerance(1e-4, 1e-4)  # Inductor's fused kernels against eager ATen, float32: the contract's "1e-4"
BUFFERS = ("input_ids", "positions", "hidden", "qkv", "attn", "final")
COMPILE_CONFIG = gpt.GPTConfig(n_positions=64, n_embd=16, n_layer=3, n_head=2)  # 12c's one model: 4 pieces of 3 kinds


@pytest.fixture(scope="module")
def student():
    return implementation("ex12_piecewise_graphs")


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


# ----------------------------------------------------------------------------------------------
# A step's state: sequences in a paged cache (exercise 5's forward put their first tokens there), each about to
# compute a chunk of new tokens (one: a decode token)

class Step:
    """S sequences whose first `cached[i]` tokens are in a paged cache (blocks scattered over the pool), each
    about to compute `new[i]` more tokens. The pool has a spare block beyond the sequences' own."""

    def __init__(self, model, block_size, cached, new, rng):
        vocab = model.config.vocab_size
        self.block_size = block_size
        need = [-(-(c + k) // block_size) for c, k in zip(cached, new)]
        num_blocks = sum(need) + 2
        pool = rng.sample(range(num_blocks), num_blocks)
        self.blocks = [pool[sum(need[:i]):sum(need[:i + 1])] for i in range(len(cached))]
        self.cache = paged.PagedKVCache(model.config, num_blocks, block_size, model.device, next(model.parameters()).dtype)
        rows = [i for i, c in enumerate(cached) if c]
        if rows:
            paged.forward(model, self.cache, [[rng.randrange(vocab) for _ in range(cached[i])] for i in rows], [0] * len(rows),
                          [self.blocks[i] for i in rows])
        self.token_ids = [[rng.randrange(vocab) for _ in range(k)] for k in new]
        self.starts = list(cached)
        self.tokens = sum(new)

    def args(self):
        return self.token_ids, self.starts, self.blocks

    def expected(self, model):
        """Exercise 5's forward over the step on a copy of the cache: (logits, the cache after)."""
        cache = copy.deepcopy(self.cache)
        return paged.forward(model, cache, *self.args()), cache

    def describe(self):
        return (f"{len(self.starts)} sequences with {self.starts} tokens cached, computing {[len(t) for t in self.token_ids]} "
                f"new ones ({self.tokens} tokens), blocks of {self.block_size}")


def pools(cache):
    return cache.keys + cache.values


def check_pools(got, expected, what):
    for i, (pool, ref) in enumerate(zip(pools(got), pools(expected))):
        wrong = [b for b in range(len(pool)) if max_diff(pool[b], ref[b]) > 1e-4]
        assert not wrong, (
            f"{what}: the {'key' if i < len(got.keys) else 'value'} pool of layer {i % len(got.keys)} differs from what exercise "
            f"5's forward leaves in blocks {wrong[:8]}. Only the real tokens write their keys and values, each at its own slot; "
            f"a padding row writes nowhere ({HINTS}, piecewise_forward, hint 2).")


def mixed_step(model, rng, max_seqs=4, block_size=4):
    """A step with decode tokens and chunks of prompts, some sequences new, some with a cached prefix."""
    n = rng.randint(1, max_seqs)
    top = model.config.n_positions
    cached = [rng.choice([0, 0, rng.randint(1, 20)]) for _ in range(n)]
    new = [rng.choice([1, 1, rng.randint(2, 12)]) for _ in range(n)]
    new = [min(k, top - c) for c, k in zip(cached, new)]
    return Step(model, block_size, cached, new, rng)


# ----------------------------------------------------------------------------------------------
# 12a: the split forward

def buffers(inputs):
    return {name: getattr(inputs, name) for name in BUFFERS}


def test_12a_fill_copies_in_place_and_pads(student, model, seed):
    rng = random.Random(seed)
    inputs = student.StepInputs(model.config, 24, model.device, torch.float32)
    first = {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in buffers(inputs).items()}
    for _ in range(8):
        n = rng.randint(1, 24)
        size = rng.randint(n, 24)
        ids, positions = ([rng.randrange(high) for _ in range(n)] for high in (model.config.vocab_size, model.config.n_positions))
        inputs.fill(torch.tensor(ids), torch.tensor(positions), size)
        what = f"StepInputs(max_tokens=24).fill of {n} tokens padded to {size}"
        for name, t in buffers(inputs).items():
            assert (t.data_ptr(), tuple(t.shape), t.dtype) == first[name], (
                f"{what}: inputs.{name} is a new tensor after fill: a captured piece reads the tensors it was captured with, "
                f"for ever. Copy the values INTO the buffers made once ({HINTS}, StepInputs.fill, hint 1).")
        got_ids, got_positions = inputs.input_ids[:size].tolist(), inputs.positions[:size].tolist()
        assert (got_ids[:n], got_positions[:n]) == (ids, positions), (
            f"{what}: the first {n} rows hold ids {got_ids[:n]} at positions {got_positions[:n]}, expected {ids} at {positions}.")
        assert got_ids[n:] == [0] * (size - n) and got_positions[n:] == [0] * (size - n), (
            f"{what}: padding rows {n}..{size - 1} hold ids {got_ids[n:]} at positions {got_positions[n:]}: expected token 0 "
            f"at position 0, in range of the embeddings whatever the last step left ({HINTS}, StepInputs.fill, hint 1).")
    for n, size in ((0, 4), (5, 4), (3, 25)):
        with pytest.raises(ValueError):
            inputs.fill(torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), size)
            pytest.fail(f"fill of {n} tokens padded to {size} (buffers of 24 rows) returned: raise ValueError.")


def trace_piece(student, model, inputs, index, size):
    try:
        return graphs.trace(student.run_piece, model, inputs, index, size)[1]
    except graphs.NotCapturable as e:
        pytest.fail(f"run_piece(index={index}, size={size}) cannot be captured: {e} ({HINTS}, run_piece, hint 1)")


def test_12a_run_piece_is_capturable_and_row_by_row(student, model, seed):
    """Each piece at a size, for two fills with other values (and other numbers of real rows): the same kernels with
    the same shapes, no host read; rows past `size` untouched; a real row's results independent of the others."""
    rng = random.Random(seed)
    config = model.config
    for size in (1, 5, 16):
        runs = []
        for _ in range(2):
            inputs = reference.StepInputs(config, 20, model.device, torch.float32)
            n = rng.randint(1, size)
            inputs.fill(torch.tensor([rng.randrange(config.vocab_size) for _ in range(n)]),
                        torch.tensor([rng.randrange(config.n_positions) for _ in range(n)]), size)
            for name in ("hidden", "attn", "qkv", "final"):
                getattr(inputs, name).normal_(generator=torch.Generator().manual_seed(rng.randrange(1000)))
            before = {name: t.clone() for name, t in buffers(inputs).items()}
            kernels = [trace_piece(student, model, inputs, index, size) for index in range(config.n_layer + 1)]
            runs.append(kernels)
            for name, t in buffers(inputs).items():
                assert torch.equal(t[size:], before[name][size:]), (
                    f"run_piece at size {size} changed inputs.{name}'s rows past {size}: a piece reads and writes only the "
                    f"first `size` rows ({HINTS}, run_piece, hint 1).")
        for index, (a, b) in enumerate(zip(*runs)):
            assert a == b, (
                f"run_piece(index={index}, size={size}) ran other kernels for two fills of that size ({len(a)} and {len(b)} "
                f"operations): a graph replays what one call ran, so every shape and branch must follow from size and index "
                f"alone, never from the values in the buffers ({HINTS}, run_piece, hint 1).")


def test_12a_piecewise_forward_equals_exercise_5s_forward(student, model, seed):
    """Mixed steps (decode tokens and chunks, cached prefixes) padded to the step's own count, to a capture size and to
    the buffers' whole height: exercise 5's logits, and every block of the pool as exercise 5's forward leaves it."""
    rng = random.Random(seed)
    for trial in range(4):
        step = mixed_step(model, rng)
        expected, cache_after = step.expected(model)
        for size in sorted({step.tokens, reference.ex11.padded_size(step.tokens, reference.token_capture_sizes(64)), 64}):
            cache = copy.deepcopy(step.cache)
            inputs = student.StepInputs(model.config, 64, model.device, torch.float32)
            calls = []
            piece = lambda index: (calls.append(index), student.run_piece(model, inputs, index, size))  # noqa: E731
            logits = student.piecewise_forward(model, cache, inputs, *step.args(), size, piece)
            what = f"piecewise_forward of {step.describe()}, padded to {size}"
            assert calls == list(range(model.config.n_layer + 1)), (
                f"{what}: called piece() with the indices {calls}: each piece once, in order 0 .. {model.config.n_layer} "
                f"(attention of layer i between piece i and piece i + 1) ({HINTS}, piecewise_forward, hint 1).")
            assert tuple(logits.shape) == tuple(expected.shape) and max_diff(logits, expected) < 1e-3, (
                f"{what}: logits of shape {tuple(logits.shape)}, {max_diff(logits, expected) if logits.shape == expected.shape else '-'} "
                f"from exercise 5's forward (shape {tuple(expected.shape)}): one row per sequence, its last new token's "
                f"({HINTS}, piecewise_forward, hint 2).")
            check_pools(cache, cache_after, what)


@st.composite
def fill_scenarios(draw):
    """StepInputs of max_tokens around the capture sizes, then 1 to 4 fills of n tokens padded to a size (n at and
    around 1 and the size; n past the size and a size past the buffers: ValueError)."""
    max_tokens = draw(around(1, 2, 4, 8, 16, low=1, high=40))
    fills = []
    for _ in range(draw(st.integers(1, 4))):
        size = draw(st.one_of(st.sampled_from(reference.token_capture_sizes(max_tokens)), around(max_tokens, low=1, high=max_tokens + 1)))
        n = draw(st.one_of(st.sampled_from(sorted({1, size, size + 1} - {0})), st.integers(1, max(1, size))))
        fills.append((draw(st.lists(token_ids(), min_size=n, max_size=n)), draw(st.lists(st.integers(0, 63), min_size=n, max_size=n)), size))
    return max_tokens, fills


def observe_inputs(step):
    def observe(inputs):
        n, size = step
        size = min(size, len(inputs.input_ids))
        now = {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in buffers(inputs).items()}
        first = observe.built.setdefault(id(inputs), now)
        return {"input_ids[:size]": inputs.input_ids[:size].tolist(), "positions[:size]": inputs.positions[:size].tolist(),
                "the buffers are the tensors __init__ made": now == first,
                "buffer shapes and dtypes": {name: (tuple(t.shape), str(t.dtype)) for name, t in buffers(inputs).items()}}
    observe.built = {}
    return observe


def test_12a_differential_fill(student, seed):
    """token_capture_sizes, then generated StepInputs filled several times: after each fill the real rows and the
    padding (token 0 at position 0), the same buffers throughout, ValueError outside 1 <= n <= size <= max_tokens."""
    config = gpt.GPTConfig(n_positions=64, n_embd=8, n_layer=1, n_head=2)

    def check(scenario):
        max_tokens, fills = scenario
        step = [0, 0]
        observe = observe_inputs(step)
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, StepInputs.fill, hint 1.")
        twins.call(f"token_capture_sizes({max_tokens})", lambda side: side.token_capture_sizes(max_tokens))
        inputs = twins.call(f"StepInputs(a config of width 8, max_tokens={max_tokens}, 'cpu', torch.float32)",
                            lambda side: side.StepInputs(config, max_tokens, "cpu", torch.float32), observe=observe, returns=None)
        for ids, positions, size in fills:
            step[:] = len(ids), size
            ids_t, positions_t = torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
            inputs.call(f"fill({ids}, {positions}, {size})", lambda side, i, p: side.fill(i, p, size), inputs=(ids_t, positions_t))

    explore(fill_scenarios(), check, seed=seed, examples=40, edges=[(1, [([5], [0], 1)]), (8, [([1, 2], [3, 4], 8), ([7], [0], 9)])])


@st.composite
def step_scenarios(draw, max_seqs=4):
    """A small model (heads, widths, layers and context unlike tiny's), blocks of 1, 3 or 4, 1 to max_seqs sequences,
    each with a cached prefix (none, or at and around block edges) and 1 or more new tokens (a decode token, a chunk,
    a whole prompt, up to the context's end); the model in a drawn dtype."""
    config, block_size = draw(small_config(max_layers=2, n_positions=(16, 24, 32))), draw(st.sampled_from([1, 3, 4]))
    top = config.n_positions
    seqs = []
    for _ in range(draw(st.integers(1, max_seqs))):
        cached = draw(st.one_of(st.just(0), around(block_size, 2 * block_size, low=0, high=top - 1)))
        new = draw(st.one_of(st.just(1), around(block_size, low=1, high=top - cached)))
        seqs.append((cached, max(1, min(new, top - cached))))
    return config, block_size, seqs, draw(st.randoms(use_true_random=False)), draw(dtypes())


def test_12a_differential_forward(student, seed):
    """Generated mixed steps through piecewise_forward, the pieces run by each side's run_piece (and once with piece None),
    padded to a capture size that holds them: the logits, every block of the pool afterwards and the pieces called, against
    the reference's; the caller's lists unchanged."""
    def check(scenario):
        config, block_size, seqs, rng, dtype = scenario
        model = small_model(config, dtype=dtype)
        step = Step(model, block_size, [c for c, _ in seqs], [k for _, k in seqs], rng)
        sizes = reference.token_capture_sizes(max(step.tokens, 16))
        size = rng.choice([s for s in sizes if s >= step.tokens])
        default = rng.random() < 0.3

        def run(side, token_ids, starts, tables):
            cache = copy.deepcopy(step.cache)
            inputs = side.StepInputs(config, sizes[-1], "cpu", dtype)
            calls = []
            piece = None if default else lambda index: (calls.append(index), side.run_piece(model, inputs, index, size))
            logits = side.piecewise_forward(model, cache, inputs, token_ids, starts, tables, size, piece)
            return {"logits": logits, "the pool afterwards": pools(cache), "pieces called": calls}

        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, piecewise_forward, hint 2.", tol=tolerance(dtype, LOGITS))
        twins.call(f"piecewise_forward(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width "
                   f"{config.n_embd}, context {config.n_positions}; {step.describe()}, padded to {size}, "
                   f"piece={'None' if default else 'run_piece at that size'})", run, inputs=step.args(), again=True)

    explore(step_scenarios(), check, seed=seed, examples=12)


# ----------------------------------------------------------------------------------------------
# 12b: capture and dispatch

class Spy:
    """Which pieces run_piece ran (index, size, inside a capture or not), which graphs replayed, which captures."""

    def __init__(self, student, monkeypatch):
        self.calls, self.replays = [], []
        # run_piece is looked up in the globals of the code that calls it: the module's own, and those of the runner's
        # methods where they were written elsewhere (a base class, a copy)
        namespaces = {id(vars(student)): vars(student)}
        for cls in student.PiecewiseGraphs.__mro__:
            for method in (vars(cls).get(name) for name in ("__init__", "capture", "run")):
                found = getattr(method, "__globals__", {})
                if "run_piece" in found:
                    namespaces[id(found)] = found
        for namespace in namespaces.values():
            monkeypatch.setitem(namespace, "run_piece", self.spied(namespace["run_piece"]))
        replay = graphs.CPUGraph.replay

        def spied_replay(graph):
            self.replays.append(graph)
            return replay(graph)

        monkeypatch.setattr(graphs.CPUGraph, "replay", spied_replay)
        if torch.cuda.is_available():
            cuda_replay = torch.cuda.CUDAGraph.replay

            def spied_cuda_replay(graph):
                self.replays.append(graph)
                return cuda_replay(graph)

            monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", spied_cuda_replay)
        self.captures_before = len(graphs.CAPTURES)

    def spied(self, run_piece):
        def spied_run_piece(model, inputs, index, size):
            self.calls.append((size, index, graphs.capturing()))
            return run_piece(model, inputs, index, size)
        return spied_run_piece

    def captures(self):
        return graphs.CAPTURES[self.captures_before:]

    def key_of(self):
        return {id(g): (size, index) for size, index, g in self.calls if g is not None}


def test_12b_one_graph_per_size_and_piece_replayed_in_order(student, model, seed, monkeypatch):
    """PiecewiseGraphs(max_tokens=20, use_graphs=True) on the CPU stand-in: one graph per capture size and piece,
    captured after a warm-up, the largest size first, one pool; then mixed steps of several token counts, each
    replaying its padded size's pieces in order, with exercise 5's logits and pool."""
    rng = random.Random(seed)
    spy = Spy(student, monkeypatch)
    step0 = mixed_step(model, rng)
    before = copy.deepcopy(step0.cache)
    runner = student.PiecewiseGraphs(model, step0.cache, 20, use_graphs=True)
    what = "PiecewiseGraphs(max_tokens=20, use_graphs=True) on the CPU stand-in"
    check_pools(step0.cache, before, f"{what}, when built (its warm-ups and captures run the pieces, which write only the buffers)")
    pieces = model.config.n_layer + 1
    pairs = sorted((size, index) for size in runner.sizes for index in range(pieces))
    captured = [(size, index) for size, index, g in spy.calls if g is not None]
    assert sorted(captured) == pairs, (
        f"{what}: captured (size, piece) {sorted(captured)[:12]}..., expected each of the sizes {runner.sizes} with each piece "
        f"0 .. {pieces - 1}, once ({HINTS}, PiecewiseGraphs.capture, hint 1).")
    assert sorted(runner.graphs) == pairs, f"{what}: runner.graphs holds the keys {sorted(runner.graphs)[:12]}..., expected (size, piece) pairs."
    assert captured[0][0] == runner.sizes[-1], (
        f"{what}: the first capture was at size {captured[0][0]}: capture the largest size first, so that the shared pool is "
        f"sized by it ({HINTS}, PiecewiseGraphs.capture, hint 2).")
    first_capture = next(i for i, (_, _, g) in enumerate(spy.calls) if g is not None)
    assert first_capture > 0, f"{what}: the first capture came before any piece ran: warm up first ({HINTS}, PiecewiseGraphs.capture, hint 2)."
    caps = spy.captures()
    shared = {id(g): g.pool() for g, _ in caps}
    later = [pool for _, pool in caps[1:]]
    assert all(pool is not None and pool in shared.values() for pool in later) and len(set(map(repr, later))) <= 1, (
        f"{what}: the graphs after the first were captured with pools {later[:3]}...: one pool for all, the first graph's "
        f"graph.pool() ({HINTS}, PiecewiseGraphs.capture, hint 2).")
    key_of = spy.key_of()
    for trial in range(5):
        step = mixed_step(model, rng) if trial else step0
        if step.tokens > 20:
            continue
        runner.cache = step.cache if trial else runner.cache
        expected, cache_after = step.expected(model)
        calls, replays = len(spy.calls), len(spy.replays)
        logits = runner.run(*step.args())
        size = reference.ex11.padded_size(step.tokens, runner.sizes)
        got = [key_of.get(id(g)) for g in spy.replays[replays:]]
        where = f"{what}, run() of {step.describe()}"
        assert len(spy.calls) == calls, f"{where}: ran run_piece {len(spy.calls) - calls} time(s): with graphs each piece is a replay."
        assert got == [(size, index) for index in range(pieces)], (
            f"{where}: replayed the graphs {got}, expected {[(size, i) for i in range(pieces)]}: the pieces of the smallest "
            f"capture size that holds {step.tokens} tokens, in order ({HINTS}, PiecewiseGraphs.run, hint 1).")
        assert max_diff(logits, expected) < 1e-3, f"{where}: logits {max_diff(logits, expected):.3g} from exercise 5's forward."
        check_pools(runner.cache, cache_after, where)


def test_12b_pieces_run_eagerly_at_the_steps_own_count_without_graphs(student, model, seed, monkeypatch):
    rng = random.Random(seed)
    spy = Spy(student, monkeypatch)
    step = mixed_step(model, rng)
    runner = student.PiecewiseGraphs(model, step.cache, 64, use_graphs=False)
    assert not spy.calls and not spy.captures(), "PiecewiseGraphs(use_graphs=False) ran or captured pieces when built: nothing to capture."
    expected, cache_after = step.expected(model)
    logits = runner.run(*step.args())
    what = f"PiecewiseGraphs(max_tokens=64, use_graphs=False).run() of {step.describe()}"
    assert [(s, i) for s, i, _ in spy.calls] == [(step.tokens, i) for i in range(model.config.n_layer + 1)] and not spy.replays, (
        f"{what}: ran the pieces (size, index) {[(s, i) for s, i, _ in spy.calls]}: without graphs each piece once, in order, "
        f"at the step's own {step.tokens} tokens (padding buys nothing without a graph) ({HINTS}, PiecewiseGraphs.run, hint 2).")
    assert max_diff(logits, expected) < 1e-3, f"{what}: logits {max_diff(logits, expected):.3g} from exercise 5's forward."
    check_pools(runner.cache, cache_after, what)
    runner = student.PiecewiseGraphs(model, step.cache, 2, use_graphs=True)
    if step.tokens > 2:
        with pytest.raises(ValueError):
            runner.run(*step.args())
            pytest.fail(f"PiecewiseGraphs(max_tokens=2, use_graphs=True).run() of {step.tokens} tokens returned: no graph "
                        f"holds them; raise ValueError (padded_size does).")


def requests_of(prompts, max_new_tokens, **fields):
    return [paged.Request(list(p), m, **fields) for p, m in zip(prompts, max_new_tokens)]


def expected_mode(scheduled, graphs_on, largest):
    tokens = sum(n for _, n in scheduled)
    if graphs_on and all(n == 1 for _, n in scheduled):
        return "full"
    return "piecewise" if graphs_on and tokens <= largest else "eager"


def watched_engine(student, model, max_batch, spy, **options):
    """The student's Engine, its run_model wrapped: each step's scheduled token counts and the replays it made."""
    engine = student.Engine(model, max_batch, eos_token_id=NO_EOS, **options)
    engine.steps_seen = []
    run_model = engine.run_model

    def watched(scheduled):
        before = len(spy.replays)
        logits = run_model(scheduled)
        engine.steps_seen.append(([n for _, n in scheduled], spy.replays[before:]))
        return logits
    engine.run_model = watched
    return engine


def check_same_tokens(got, expected, prompts, model, tokenizer, what, sampled):
    for i, (g, e, prompt) in enumerate(zip(got.outputs, expected.outputs, prompts)):
        problem = (None if g == e else f"continuation {i}: {g} against {e}") if sampled else compare_tokens(g, e, model, prompt, tokenizer)
        assert problem is None, (f"{what}: continuation {i} differs from exercise 5's engine on the same requests:\n{problem}\n"
                                 f"({HINTS}, Engine.run_model, hint 1).")


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_12b_every_step_in_its_mode_with_exercise_5s_tokens(student, model, tokenizer, seed, monkeypatch, sampled):
    """Requests arriving over the first steps with a token budget of 24 (chunked prefill beside decode tokens), graphs on (the CPU
    stand-in), every step captured up to the budget but for one run whose captures stop at 8 tokens: exercise 5's
    tokens; each step's mode ("full" decode-only, "piecewise" up to the largest capture size, "eager" past it) and
    the graphs it replayed (one for a full step, n_layer + 1 for a piecewise one, none for an eager one)."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    # two long prompts (chunks of the budget), then short ones arriving while they decode (small mixed steps)
    lengths, arrivals = [rng.randint(20, 40), rng.randint(9, 30), rng.randint(1, 4), rng.randint(1, 5), rng.randint(2, 6)], [0, 0, 3, 6, 9]
    prompts = [[rng.randrange(vocab) for _ in range(k)] for k in lengths]
    new_tokens = [rng.randint(8, 20) for _ in prompts]
    fields = {"sampling": SamplingParams(top_k=10, seed=seed)} if sampled else {}
    reqs = lambda: [paged.Request(list(p), m, arrival_step=a, **fields) for p, m, a in zip(prompts, new_tokens, arrivals)]  # noqa: E731
    options = dict(max_num_batched_tokens=24, block_size=8)
    expected = paged.generate(model, reqs(), 4, eos_token_id=NO_EOS, **options)
    for capture in (None, 8):
        spy = Spy(student, monkeypatch)
        engine = watched_engine(student, model, 4, spy, cuda_graphs=True, max_capture_tokens=capture, **options)
        what = f"Engine(max_batch_size=4, cuda_graphs=True, max_capture_tokens={capture}, {options})" + (" sampled" if sampled else "")
        largest = capture or 24
        assert engine.pieces is not None and engine.pieces.sizes[-1] == largest, (
            f"{what}: its pieces' capture sizes end at {engine.pieces.sizes[-1] if engine.pieces else None}, expected {largest}: "
            f"they must cover every step up to the token budget (or max_capture_tokens) ({HINTS}, Engine.__init__, hint 1).")
        got = engine.run(reqs())
        check_same_tokens(got, expected, prompts, model, tokenizer, what, sampled)
        pieces = model.config.n_layer + 1
        assert len(engine.modes) == len(engine.steps_seen), (
            f"{what}: {len(engine.steps_seen)} steps and {len(engine.modes)} modes in engine.modes: one mode per step ({HINTS}, "
            f"Engine.run_model, hint 1).")
        for i, ((ns, replays), mode) in enumerate(zip(engine.steps_seen, engine.modes)):
            scheduled = [(None, n) for n in ns]
            want = expected_mode(scheduled, True, largest)
            replayed = {"full": 1, "piecewise": pieces, "eager": 0}[want]
            assert mode == want and len(replays) == replayed, (
                f"{what}: step {i} computed {ns} tokens per sequence ({sum(ns)} in all), ran as {mode!r} and replayed "
                f"{len(replays)} graph(s); expected {want!r} and {replayed}: a decode-only step replays its full graph, any "
                f"other step of up to {largest} tokens the {pieces} pieces of its padded size, a larger one runs eager "
                f"({HINTS}, Engine.run_model, hint 1).")
        modes = set(engine.modes)
        assert {"full", "piecewise"} <= modes and (capture is None or "eager" in modes), f"the workload must reach every mode: {modes}"


def test_12b_no_graphs_no_pieces(student, model, seed, monkeypatch):
    """cuda_graphs=False and no compile: exercise 5's steps, every one "eager", nothing captured; on a CPU the default
    (None) is the same."""
    work = mixed_workload(model, 3, prompt_len=(1, 30), output_len=(1, 10), seed=seed)
    for cuda_graphs in (False, None):
        spy = Spy(student, monkeypatch)
        engine = watched_engine(student, model, 2, spy, cuda_graphs=cuda_graphs)
        engine.run(requests_of(work.prompts, work.max_new_tokens))
        on_cuda = model.device.type == "cuda" and cuda_graphs is None
        if on_cuda:
            continue
        assert engine.pieces is None and not spy.captures() and engine.modes == ["eager"] * len(engine.steps_seen), (
            f"Engine(cuda_graphs={cuda_graphs}) on {model.device}: pieces {engine.pieces}, {len(spy.captures())} capture(s), "
            f"modes {engine.modes[:6]}...: without graphs or compile there are no pieces and every step is exercise 5's, "
            f"\"eager\" ({HINTS}, Engine.__init__, hint 1).")


def observe_runner(runner):
    return {"graphs (size, piece)": sorted(runner.graphs),
            "replays per (size, piece)": {key: getattr(g, "replays", None) for key, g in sorted(runner.graphs.items())},
            "the pool": read(pools(runner.cache))}


def test_12b_differential_graphs(student, seed):
    """Generated PiecewiseGraphs, with graphs (the CPU stand-in) or without, run by hand over mixed steps (one may be
    past the largest capture size: ValueError with graphs): after building and after every run, the logits, the graphs
    held and how often each replayed, and the pool."""
    def check(scenario):
        config, block_size, seqs, rng, dtype = scenario
        model = small_model(config, dtype=dtype)
        step = Step(model, block_size, [c for c, _ in seqs], [k for _, k in seqs], rng)
        use_graphs = rng.random() < 0.7
        max_tokens = rng.choice([step.tokens, max(1, step.tokens - 1), step.tokens + 3, 16]) if use_graphs else max(step.tokens, 16)
        mods = Twins(reference, student, hint=f"Hint: see {HINTS}, PiecewiseGraphs.capture and PiecewiseGraphs.run.",
                     tol=tolerance(dtype, LOGITS))
        runner = mods.call(f"PiecewiseGraphs(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width "
                           f"{config.n_embd}; a cache of blocks of {block_size}, max_tokens={max_tokens}, use_graphs={use_graphs})",
                           lambda m: m.PiecewiseGraphs(model, copy.deepcopy(step.cache), max_tokens, use_graphs=use_graphs),
                           observe=observe_runner, returns=None)
        for _ in range(2):
            runner.call(f"run({step.describe()})", lambda r, t, s, b: r.run(t, s, b), inputs=step.args())

    explore(step_scenarios(max_seqs=3), check, seed=seed, examples=8)


def observe_engine(engine):
    """An engine after a step: each sequence's tokens (greedy: near ties tolerated), the finished in order, the
    allocator's blocks and free blocks, preemptions, steps, and each step's mode (for exercise 5's engine: the mode
    the contract gives each step it scheduled)."""
    return {"each sequence's tokens": [GreedyTokens(list(s.output_ids), engine.model, tuple(s.request.prompt_ids))
                                       for s in engine.sequences],
            "finished, in order": [s.id for s in engine.finished], "blocks in the allocator": engine.allocator.num_blocks,
            "free blocks": engine.allocator.num_free_blocks, "preemptions": engine.stats.preemptions,
            "steps": engine.stats.steps, "modes": list(engine.modes)}


def iteration(engine):
    if engine.start is None:
        engine.start = time.perf_counter()
    if not engine.waiting and not engine.running:
        engine.wait_for_next_arrival()
    engine.step()
    engine.step_index += 1


@st.composite
def engine_scenarios(draw):
    """A small model, blocks of 1, 3 or 4, 1 to 3 requests (prompts at and around block edges and the budget, one may
    end at the context's end, late arrivals), max_batch_size 1 to 3, a token budget, max_capture_tokens None or below
    the budget, a pool sometimes small enough to preempt, cuda_graphs True, False or None; the model in a drawn dtype."""
    config, block_size = draw(small_config(max_layers=2)), draw(st.sampled_from([1, 3, 4]))
    budget = draw(st.sampled_from([3, 8, 16]))
    requests = []
    for _ in range(draw(st.integers(1, 3))):
        new = draw(around(1, block_size, low=1, high=6))
        prompt = draw(st.one_of(around(block_size, budget, low=1, high=20), st.just(config.n_positions - new)))
        requests.append((prompt, new, draw(st.integers(0, 3))))
    longest = max(-(-(p + m - 1) // block_size) for p, m, _ in requests)
    return (config, block_size, requests, draw(st.integers(1, 3)), budget, draw(st.sampled_from([None, None, 1, 2, 5])),
            draw(st.sampled_from([None, longest, longest + 2])), draw(st.sampled_from([True, True, False, None])),
            draw(st.integers(0, 2 ** 16)), draw(dtypes()))


def test_12b_differential_engine(student, seed):
    """Generated requests served by your Engine and by exercise 5's, stepped by hand and observed after EVERY step: the
    same tokens, finish order, blocks, preemptions and steps, and each step's mode as the contract gives it; then
    generate() against exercise 5's."""
    def check(scenario):
        config, block_size, plan, max_batch, budget, capture, num_blocks, cuda_graphs, g_seed, dtype = scenario
        model = small_model(config, dtype=dtype)
        rng = random.Random(g_seed)
        prompts = [[rng.randrange(config.vocab_size) for _ in range(p)] for p, _, _ in plan]
        budget = max(budget, max_batch)
        options = dict(block_size=block_size, max_num_batched_tokens=budget, num_blocks=num_blocks)
        graphs_on = bool(cuda_graphs)
        largest = min(budget, capture or budget)

        def build(m):
            if m is not paged:
                return m.Engine(model, max_batch, cuda_graphs=cuda_graphs, max_capture_tokens=capture, eos_token_id=NO_EOS, **options)
            engine = paged.Engine(model, max_batch, eos_token_id=NO_EOS, **options)
            engine.modes, run_model = [], engine.run_model

            def counted(scheduled):
                engine.modes.append(expected_mode(scheduled, graphs_on, largest))
                return run_model(scheduled)
            engine.run_model = counted
            return engine

        mods = Twins(paged, student, hint=f"Hint: see {HINTS}, Engine.__init__ and Engine.run_model.")
        engine = mods.call(f"Engine(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, "
                           f"context {config.n_positions}; max_batch_size={max_batch}, cuda_graphs={cuda_graphs}, max_capture_tokens="
                           f"{capture}, {options}) (exercise 5's Engine on the reference's side)", build, observe=observe_engine, returns=None)
        for prompt, (_, new, arrival) in zip(prompts, plan):
            engine.call(f"add_request(Request({plural(len(prompt), 'token')}, max_new_tokens={new}, arrival_step={arrival}))",
                        lambda e: e.add_request(paged.Request(list(prompt), new, arrival_step=arrival)), returns=None)
        for _ in range(200):
            if not (engine.reference.pending or engine.reference.waiting or engine.reference.running):
                break
            engine.call(f"step() (step index {engine.reference.step_index})", iteration)
        requests = lambda: [paged.Request(list(p), new, arrival_step=a) for p, (_, new, a) in zip(prompts, plan)]  # noqa: E731
        mods.call("generate(the same requests)",
                  lambda m: [GreedyTokens(out, model, tuple(p)) for out, p in zip(
                      (paged.generate(model, requests(), max_batch, NO_EOS, **options) if m is paged else
                       m.generate(model, requests(), max_batch, cuda_graphs=cuda_graphs, eos_token_id=NO_EOS, **options)).outputs, prompts)])

    explore(engine_scenarios(), check, seed=seed, examples=8)


# ----------------------------------------------------------------------------------------------
# 12c: fusion. Inductor on a CPU needs a C++ compiler; without one the checks say so and skip.

def compiler_missing():
    from torch._inductor import cpp_builder

    try:
        return None if cpp_builder.get_cpp_compiler() and shutil.which(cpp_builder.get_cpp_compiler()) else "no C++ compiler found"
    except Exception as e:  # noqa: BLE001 - whatever Inductor says when it finds none
        return f"Inductor finds no C++ compiler ({type(e).__name__}: {e})"


@pytest.fixture(scope="module")
def compile_model(device):
    """12c's model: small, so that its 3 kinds of pieces compile in seconds; float32 (the contract's tolerance is float32's)."""
    if torch.device(device).type != "cuda":
        missing = compiler_missing()
        if missing:
            pytest.skip(f"torch.compile's Inductor builds its CPU kernels with a C++ compiler: {missing} (install g++ or "
                        f"clang to grade 12c on this machine)")
    return small_model(COMPILE_CONFIG, device=device)


def dynamo_counters():
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def filled(model, max_tokens, n, size, seed):
    inputs = reference.StepInputs(model.config, max_tokens, model.device, torch.float32)
    g = torch.Generator().manual_seed(seed)
    inputs.fill(torch.randint(model.config.vocab_size, (n,), generator=g), torch.randint(model.config.n_positions, (n,), generator=g), size)
    for name in ("hidden", "attn"):
        getattr(inputs, name).copy_(torch.randn(getattr(inputs, name).shape, generator=g))
    return inputs


@pytest.fixture(scope="module")
def compiled(student, compile_model):
    """compile_piece() once for the module, with the graphs it compiled counted (sizes 8, 16, 1, 5, 24, each piece)."""
    graphs_before, breaks_before = dynamo_counters()
    piece = student.compile_piece()
    for size in (8, 16, 1, 5, 24):
        inputs = filled(compile_model, 24, size, size, size)
        for index in range(COMPILE_CONFIG.n_layer + 1):
            piece(compile_model, inputs, index, size)
    graphs_after, breaks_after = dynamo_counters()
    return piece, graphs_after - graphs_before, breaks_after - breaks_before


def test_12c_compiled_pieces_equal_eager_and_compile_once_per_piece(student, compile_model, compiled, seed):
    piece, count, breaks = compiled
    pieces = COMPILE_CONFIG.n_layer + 1
    assert count >= 1, (
        f"compile_piece()'s pieces ran at 5 token counts and torch.compile compiled nothing: return run_piece compiled by "
        f"torch.compile (Inductor), not run_piece itself ({HINTS}, compile_piece, hint 1).")
    kinds = 3  # the first piece, a middle one, the last
    assert count <= 2 * kinds and not breaks, (
        f"compile_piece(): {count} graphs compiled for the {pieces} pieces of a {COMPILE_CONFIG.n_layer}-layer model run at 5 "
        f"token counts, {breaks} graph break(s): one compiled graph per kind of piece (the first, a middle one, the last) for "
        f"every token count (a dynamic size; a size of 1 may add one more each), and no break (fullgraph=True) ({HINTS}, "
        f"compile_piece, hint 2).")
    rng = random.Random(seed)
    for size in (rng.randint(2, 24), 1, 24):
        n = rng.randint(1, size)
        got, expected = filled(compile_model, 24, n, size, seed + size), filled(compile_model, 24, n, size, seed + size)
        for index in range(pieces):
            piece(compile_model, got, index, size)
            reference.run_piece(compile_model, expected, index, size)
            for name in ("hidden", "qkv", "final"):
                diff = max_diff(getattr(got, name)[:size], getattr(expected, name)[:size])
                assert diff <= 1e-4 * (1 + getattr(expected, name)[:size].abs().max().item()), (
                    f"compile_piece()'s piece {index} at size {size}: inputs.{name} is {diff:.3g} from run_piece's (float32): "
                    f"expected within 1e-4 ({HINTS}, compile_piece, hint 1).")


def test_12c_the_engine_runs_compiled_pieces(student, compile_model, compiled, seed, monkeypatch):
    """Engine(compile=True) with graphs off (on a CPU the stand-in cannot replay Inductor's C++ kernels): exercise 5's
    tokens, every step through the compiled pieces, each step "eager"."""
    model = compile_model
    rng = random.Random(seed)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    new = [rng.randint(1, 12) for _ in prompts]
    options = dict(max_num_batched_tokens=16, block_size=4)
    expected = paged.generate(model, requests_of(prompts, new), 3, eos_token_id=NO_EOS, **options)
    engine = student.Engine(model, 3, cuda_graphs=False, compile=True, eos_token_id=NO_EOS, **options)
    assert engine.pieces is not None, f"Engine(compile=True, cuda_graphs=False): engine.pieces is None: compile needs the pieces ({HINTS}, Engine.__init__, hint 1)."
    runs = []
    compiled_run = engine.pieces.run_piece
    engine.pieces.run_piece = lambda *args: (runs.append(args[2:]), compiled_run(*args))[1]
    got = engine.run(requests_of(prompts, new))
    what = f"Engine(max_batch_size=3, cuda_graphs=False, compile=True, {options})"
    for i, (g, e, p) in enumerate(zip(got.outputs, expected.outputs, prompts)):
        problem = compare_tokens(g, e, model, p, None)
        assert problem is None, f"{what}: continuation {i} differs from exercise 5's:\n{problem}"
    steps = got.stats.steps
    assert engine.modes == ["eager"] * steps and len(runs) == steps * (model.config.n_layer + 1), (
        f"{what}: modes {engine.modes[:6]}..., {len(runs)} compiled piece calls over {steps} steps: every step of at most the "
        f"budget runs through the compiled pieces (n_layer + 1 calls), \"eager\" as no graph replays ({HINTS}, Engine.run_model, hint 2).")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled pieces are captured on CUDA only: the CPU stand-in replays "
                    "the ATen operations it recorded, and Inductor's fused C++ kernels are not ATen operations")
def test_12c_compiled_pieces_captured_on_cuda(student, compile_model, device, seed):
    if torch.device(device).type != "cuda":
        pytest.skip("the model is not on CUDA")
    rng = random.Random(seed)
    step = mixed_step(compile_model, rng)
    expected, cache_after = step.expected(compile_model)
    runner = student.PiecewiseGraphs(compile_model, step.cache, 32, use_graphs=True, compile=True)
    logits = runner.run(*step.args())
    assert max_diff(logits, expected) < 1e-3, f"compiled and captured pieces on CUDA: logits {max_diff(logits, expected):.3g} from exercise 5's."
    check_pools(runner.cache, cache_after, "compiled and captured pieces on CUDA")


@st.composite
def compile_scenarios(draw):
    """A token count at and around the capture sizes, a number of real rows, a piece, a seed for the buffers' values."""
    size = draw(around(1, 2, 8, low=1, high=24))
    return size, draw(st.integers(1, size)), draw(st.integers(0, COMPILE_CONFIG.n_layer)), draw(st.integers(0, 2 ** 16))


def test_12c_differential(student, compile_model, compiled, seed):
    """compile_piece()'s piece against the reference's run_piece (eager) on generated sizes, pieces and values: every
    buffer afterwards, within the contract's tolerance."""
    piece, _, _ = compiled
    sides = {"reference": lambda model, inputs, index, size: reference.run_piece(model, inputs, index, size), "student": piece}

    class Side:
        def __init__(self, run):
            self.run = run

    def check(scenario):
        size, n, index, value_seed = scenario
        twins = Twins(Side(sides["reference"]), Side(sides["student"]), hint=f"Hint: see {HINTS}, compile_piece.", tol=COMPILED)

        def run(side):
            inputs = filled(compile_model, 24, n, size, value_seed)
            side.run(compile_model, inputs, index, size)
            return {name: t[:size] for name, t in buffers(inputs).items()}

        twins.call(f"compile_piece()(a float32 model of 3 layers, width 16; buffers of {n} tokens padded to {size}, index={index}, "
                   f"size={size})", run)

    explore(compile_scenarios(), check, seed=seed, examples=10)
