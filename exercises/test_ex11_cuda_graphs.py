"""Checker for exercise 11, static shapes and CUDA graphs: pytest exercises/test_ex11_cuda_graphs.py (-k 11a, 11b, 11c, 11d)

A CUDA graph replays fixed shapes at fixed addresses with no Python in between, and a CPU can check
both: the buffers' addresses across steps, the kernels and shapes a step runs whatever its inputs hold
(workshop.graphs.trace), and a replay that reruns the captured operations on the captured tensors
(workshop.graphs.CPUGraph), so a value copied anywhere else is never seen. On CUDA the real graphs
are checked too, and timed against the eager step.

Why not torch.compile(step, fullgraph=True, backend="eager") as the proof of capturability: it refuses a
.item() or a tensor branch too, but it guards on Python values and recompiles where a shape comes from host
state (a list of lengths kept by fill), which a CUDA graph would silently replay with the capture's shape; it
takes seconds per size; and its errors speak of tracing, not of graphs. Comparing the kernels of two calls
and replaying the captured operations shows exactly what a graph would do.
"""

import collections
import copy
import math
import random
import time

import pytest
import torch
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import gpt
import solutions.ex11_cuda_graphs as reference
import solutions.ex5_paged_kv_cache as paged
from workshop import graphs
from workshop.grading.differential import GreedyTokens, Tolerance, Twins, explore, read, tolerance
from workshop.grading.harness import compare_tokens, implementation, paired_timing
from workshop.grading.scenarios import around, dtype_name, dtypes, small_config, small_model, token_ids
from workshop.grading.wording import plural
from workshop.serving.sampling import SamplingParams
from workshop.serving.workloads import mixed_workload

HINTS = "exercises/hints/ex11.md"
NO_EOS = -1
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "11a": ["padded_size", "StaticInputs.fill"],
    "11b": ["decode_step"],
    "11c": ["DecodeGraphs.capture", "DecodeGraphs.run"],
    "11d": ["Engine.__init__", "Engine.run_model"],
}
DIFFERENTIAL_API = {  # each public name of the stub -> the check that runs it against the reference
    "capture_sizes": "test_11a_differential_padded_size", "capture_widths": "test_11a_differential_padded_size",
    "padded_size": "test_11a_differential_padded_size",
    "StaticInputs": "test_11a_differential_fill", "StaticInputs.fill": "test_11a_differential_fill",
    "decode_step": "test_11b_differential", "DecodeGraphs": "test_11c_differential",
    "DecodeGraphs.capture": "test_11c_differential", "DecodeGraphs.run": "test_11c_differential",
    "Engine": "test_11d_differential", "Engine.run_model": "test_11d_differential", "generate": "test_11d_differential",
}


@pytest.fixture(scope="module")
def student():
    return implementation("ex11_cuda_graphs")


# ----------------------------------------------------------------------------------------------
# A decode step's state: sequences prefilled into a paged cache by exercise 5's reference

class Case:
    """n sequences whose prompts are in a paged cache (blocks scattered over the pool), each about to feed
    one token; block `scratch` is the pool's last, owned by nobody."""

    def __init__(self, model, n, seed, block_size=4, num_blocks=None, longest=40, lengths=None):
        rng = random.Random(seed)
        self.block_size, self.max_blocks = block_size, math.ceil(model.config.n_positions / block_size)
        if lengths is None:
            lengths = [rng.randint(1, longest) for _ in range(n)]
            lengths[rng.randrange(n)] = rng.choice([block_size, 2 * block_size])  # a token that opens a new block
        need = [math.ceil((k + 1) / block_size) for k in lengths]  # the prompt and the token fed next
        num_blocks = num_blocks or sum(need) + 8
        self.scratch = num_blocks  # the pool's last block, owned by nobody
        pool = rng.sample(range(num_blocks), num_blocks)  # blocks scattered over the pool
        self.blocks = [pool[sum(need[:i]):sum(need[:i + 1])] for i in range(n)]
        self.cache = paged.PagedKVCache(model.config, num_blocks + 1, block_size, model.device)
        prompts = [[rng.randrange(model.config.vocab_size) for _ in range(k)] for k in lengths]
        paged.forward(model, self.cache, prompts, [0] * n, self.blocks)
        self.prompts = prompts
        self.tokens = [rng.randrange(model.config.vocab_size) for _ in range(n)]
        self.positions = lengths

    def expected(self, model):
        """Exercise 5's forward over the same decode step on a copy of the cache: (logits, pools after)."""
        cache = copy.deepcopy(self.cache)
        logits = paged.forward(model, cache, [[t] for t in self.tokens], self.positions, self.blocks)
        return logits, cache

    def owned(self):
        return sorted({b for table in self.blocks for b in table})


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def check_pools(got, expected, case, what):
    """Every block but the scratch block holds what exercise 5's forward leaves there."""
    for layer, (k, v, k_ref, v_ref) in enumerate(zip(got.keys, got.values, expected.keys, expected.values)):
        for name, pool, ref in (("key", k, k_ref), ("value", v, v_ref)):
            wrong = [b for b in range(case.scratch) if max_diff(pool[b], ref[b]) > 1e-4]
            owned = [b for b in wrong if b in case.owned()]
            assert not wrong, (
                f"{what}: layer {layer}'s {name} pool differs from exercise 5's forward in blocks {wrong[:8]} "
                + (f"(owned by the sequences: {owned[:8]}). " if owned else "(owned by nobody). ")
                + f"Each real row writes its new key and value at its own slot, once; a padded row writes only into "
                f"the scratch block {case.scratch}, which no sequence owns ({HINTS}, StaticInputs.fill, hint 2).")


# ----------------------------------------------------------------------------------------------
# 11a: static inputs

FIELDS = ("input_ids", "positions", "slots", "block_tables", "context_lens")


def test_11a_padded_size_is_the_smallest_capture_size_that_fits(student, seed):
    rng = random.Random(seed)
    for _ in range(20):
        sizes = sorted(rng.sample(range(1, 70), rng.randint(1, 6)))
        for n in range(1, max(sizes) + 1):
            expected = min(s for s in sizes if s >= n)
            got = student.padded_size(n, sizes)
            assert got == expected, (
                f"padded_size({n}, {sizes}) returned {got}, expected {expected}: the smallest capture size that holds "
                f"{n} rows (a larger one wastes work, a smaller one drops rows; {HINTS}, padded_size, hint 1).")
        for n in (max(sizes) + 1, max(sizes) + rng.randint(2, 40), 0):
            with pytest.raises(ValueError):
                student.padded_size(n, sizes)
                pytest.fail(f"padded_size({n}, {sizes}) returned instead of raising ValueError: no captured graph holds "
                            f"{n} rows; say so, and the caller runs that step eagerly ({HINTS}, padded_size, hint 1).")


def buffers(inputs):
    return {name: getattr(inputs, name) for name in FIELDS}


def test_11a_fill_copies_in_place_and_pads_to_the_scratch_block(student, model, seed):
    """Steps of 1 to 12 sequences, each filled into the same StaticInputs and padded to a size >= n."""
    rng = random.Random(seed)
    bs, max_blocks, max_batch, scratch = 4, 24, 12, 57
    inputs = student.StaticInputs(max_batch, max_blocks, bs, scratch, model.device)
    first = {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in buffers(inputs).items()}
    for step in range(12):
        n = rng.randint(1, max_batch)
        size = rng.randint(n, max_batch)
        positions = [rng.randint(0, max_blocks * bs - 1) for _ in range(n)]
        tables = [rng.sample(range(scratch), p // bs + 1) for p in positions]
        tokens = [rng.randrange(model.config.vocab_size) for _ in range(n)]
        inputs.fill(tokens, positions, tables, size)
        what = f"StaticInputs(max_batch_size={max_batch}, max_blocks={max_blocks}, block_size={bs}, scratch_block={scratch}), fill of {n} rows padded to {size}"
        for name, t in buffers(inputs).items():
            assert (t.data_ptr(), tuple(t.shape), t.dtype) == first[name], (
                f"{what}: inputs.{name} is a new tensor after fill (address, shape or dtype changed; was {first[name][1:]}, "
                f"now {(tuple(t.shape), t.dtype)}). A captured graph reads the tensor it was captured with, for ever: copy "
                f"the new values INTO the buffers allocated once ({HINTS}, StaticInputs.fill, hint 1).")
        got = {name: t[:size].tolist() for name, t in buffers(inputs).items()}
        slots = [table[p // bs] * bs + p % bs for p, table in zip(positions, tables)]
        for name, expected in (("input_ids", tokens), ("positions", positions), ("slots", slots),
                               ("context_lens", [p + 1 for p in positions])):
            assert got[name][:n] == expected, (
                f"{what}: inputs.{name}[:n] = {got[name][:n]}, expected {expected} ({HINTS}, StaticInputs.fill, hint 2).")
        for i, table in enumerate(tables):
            assert got["block_tables"][i][:len(table)] == table, (
                f"{what}: row {i}'s block table starts {got['block_tables'][i][:len(table)]}, expected {table}.")
        for i in range(n, size):
            ctx = got["context_lens"][i]
            seen = got["block_tables"][i][:math.ceil(ctx / bs)]
            assert got["slots"][i] // bs == scratch and 1 <= ctx <= max_blocks * bs and set(seen) == {scratch}, (
                f"{what}: padded row {i} writes to slot {got['slots'][i]} (block {got['slots'][i] // bs}), attends to "
                f"{ctx} keys in blocks {seen}: a padded row writes its key and value into the scratch block {scratch} "
                f"and attends to at least one key there, never a block a sequence may own ({HINTS}, StaticInputs.fill, hint 2).")


class BufferWrites(TorchDispatchMode):
    """Counts the operations that write into the given tensors' memory (on a GPU, each is a launch or a copy from
    the host); what is built on the host on the way is not counted."""

    def __init__(self, tensors):
        super().__init__()
        self.storages, self.writes = {t.untyped_storage().data_ptr() for t in tensors}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = [a for a, arg in zip(args, func._schema.arguments) if arg.is_write and isinstance(a, torch.Tensor)]
        written += [v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k == "out"]
        self.writes += any(t.untyped_storage().data_ptr() in self.storages for t in written)
        return func(*args, **kwargs)


def test_11a_fill_copies_once_per_buffer_whatever_the_batch(student, model, seed):
    """fill of 2 sequences padded to 4, and of 12 padded to 16: no more writes into the buffers for the larger (a
    write per row or per value is a copy from the host of its own on a GPU)."""
    rng = random.Random(seed)
    bs, max_blocks, scratch = 4, 24, 57
    inputs = student.StaticInputs(16, max_blocks, bs, scratch, model.device)
    counts = {}
    for n, size in ((2, 4), (12, 16)):
        positions = [rng.randint(0, max_blocks * bs - 1) for _ in range(n)]
        tables = [rng.sample(range(scratch), p // bs + 1) for p in positions]
        with BufferWrites(buffers(inputs).values()) as counter:
            inputs.fill([rng.randrange(100) for _ in range(n)], positions, tables, size)
        counts[n] = counter.writes
    assert counts[12] <= counts[2], (
        f"StaticInputs.fill wrote into the buffers {counts[2]} times for 2 sequences padded to 4 and {counts[12]} times "
        f"for 12 padded to 16: its writes grow with the batch. On a GPU each small write is a copy from the host of its "
        f"own; build each buffer's values on the host and copy them in once ({HINTS}, StaticInputs.fill, hint 2).")


# ----------------------------------------------------------------------------------------------
# 11b: a capturable step

def inputs_for(case, model, n, size, max_batch=None):
    """The reference's StaticInputs (11b is graded on its own): decode_step reads the five buffers by name."""
    inputs = reference.StaticInputs(max_batch or size, case.max_blocks, case.block_size, case.scratch, model.device)
    inputs.fill(case.tokens[:n], case.positions[:n], case.blocks[:n], size)
    return inputs


def test_11b_decode_step_equals_exercise_5s_forward(student, model, seed):
    """Batches of 1 to 7 sequences padded up to 8, at the full table width and at the widest table's."""
    for n in (1, 3, 7):
        case = Case(model, n, seed + n)
        expected, cache_after = case.expected(model)
        for size, width in ((8, case.max_blocks), (n, max(len(b) for b in case.blocks))):
            cache = copy.deepcopy(case.cache)
            inputs = inputs_for(case, model, n, size)
            logits = student.decode_step(model, cache, inputs, size, width)
            what = f"decode_step of {n} sequences padded to {size}, width {width} blocks"
            assert tuple(logits.shape) == (size, model.config.vocab_size), (
                f"{what}: logits of shape {tuple(logits.shape)}, expected [{size}, {model.config.vocab_size}]: one row per "
                f"row of the padded batch, so that the shape depends on the size only.")
            diff = max_diff(logits[:n], expected)
            assert diff < 1e-3, (
                f"{what}: the real rows' logits are {diff:.3g} from exercise 5's forward over the same step. Each row's "
                f"key and value go to its slot first, then it attends to its context_lens keys through its block table "
                f"({HINTS}, decode_step, hint 2).")
            check_pools(cache, cache_after, case, what)


def test_11b_decode_step_is_capturable(student, model, seed):
    """At each size, two steps with different sequences (lengths, tables, how many are real) run the same kernels
    with the same shapes, and nothing reads a value on the host."""
    case_a, case_b = Case(model, 6, seed, num_blocks=200), Case(model, 6, seed + 1, num_blocks=200, longest=90)  # one pool shape
    for size, (n_a, n_b) in ((1, (1, 1)), (4, (2, 4)), (8, (6, 3))):
        runs = []
        for case, n in ((case_a, n_a), (case_b, n_b)):
            inputs = inputs_for(case, model, n, size)
            cache = copy.deepcopy(case.cache)
            try:
                _, kernels = graphs.trace(student.decode_step, model, cache, inputs, size, case.max_blocks)
            except graphs.NotCapturable as e:
                pytest.fail(f"decode_step at size {size} cannot be captured: {e} ({HINTS}, decode_step, hint 1)")
            runs.append(kernels)
        a, b = runs
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            pytest.fail(
                f"decode_step at size {size} ran different kernels for two batches of that size ({n_a} and {n_b} real rows, "
                f"other lengths and tables): {len(a)} and {len(b)} operations, the first difference at operation {i}: "
                f"{a[i] if i < len(a) else 'nothing'} against {b[i] if i < len(b) else 'nothing'}. A graph replays what "
                f"one call ran: every shape and every branch must follow from size and width alone, never from the "
                f"values in the buffers or a count of real rows ({HINTS}, decode_step, hint 1).")


# ----------------------------------------------------------------------------------------------
# 11c: capture and replay

class Spy:
    """Which sizes and widths decode_step ran at (and whether inside a capture), which graphs replayed."""

    def __init__(self, student, monkeypatch):
        self.calls, self.replays = [], []
        # decode_step is looked up in the globals of the code that calls it: the module's own, and those of the
        # runner's methods where they were written elsewhere (a subclass, a copy)
        namespaces = {id(vars(student)): vars(student)}
        for method in (student.DecodeGraphs.capture, student.DecodeGraphs.run):
            found = getattr(method, "__globals__", {})
            if "decode_step" in found:
                namespaces[id(found)] = found
        for namespace in namespaces.values():
            monkeypatch.setitem(namespace, "decode_step", self.spied(namespace["decode_step"]))
        replay = graphs.CPUGraph.replay

        def spied_replay(graph):
            self.replays.append(graph)
            return replay(graph)

        monkeypatch.setattr(graphs.CPUGraph, "replay", spied_replay)
        if torch.cuda.is_available():  # the real graphs: torch.cuda.CUDAGraph.replay is a Python method too
            cuda_replay = torch.cuda.CUDAGraph.replay

            def spied_cuda_replay(graph):
                self.replays.append(graph)
                return cuda_replay(graph)

            monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", spied_cuda_replay)
        self.captures_before = len(graphs.CAPTURES)

    def spied(self, step):
        def decode_step(model, cache, inputs, size, width):
            self.calls.append((size, width, graphs.capturing()))
            return step(model, cache, inputs, size, width)
        return decode_step

    def captures(self):
        return graphs.CAPTURES[self.captures_before:]

    def key_of(self):
        """{id(graph): (size, width) it was captured at}."""
        return {id(g): (size, width) for size, width, g in self.calls if g is not None}


def runner_case(student, model, seed, max_batch, use_graphs, monkeypatch):
    case = Case(model, max_batch, seed, block_size=8)
    spy = Spy(student, monkeypatch)
    before = copy.deepcopy(case.cache)
    runner = student.DecodeGraphs(model, case.cache, max_batch, case.max_blocks, case.scratch, use_graphs=use_graphs)
    check_pools(case.cache, before, case, f"DecodeGraphs(max_batch_size={max_batch}, use_graphs={use_graphs}) when built "
                                           f"(its warm-up and captures run the step on the buffers as they are)")
    return case, spy, runner


Ran = collections.namedtuple("Ran", "n size width widest calls replays")  # a step of run_steps, and what it ran


def run_steps(student, model, case, spy, runner, seed, what, batches=None):
    """Decode steps of every batch size 1..max, each a random subset of the case's sequences (or the given lists of
    rows), checked against exercise 5's forward. Yields a Ran: n, the padded size, the width of that step's graph (the
    narrowest capture width that holds its widest table), the widest table's blocks, and the decode_step calls and
    graph replays the step made."""
    rng = random.Random(seed)
    sizes, widths = runner.sizes, runner.widths  # set by __init__ (given code)
    if batches is None:
        batches = [sorted(rng.sample(range(len(case.tokens)), n)) for n in rng.sample(range(1, len(case.tokens) + 1), len(case.tokens))]
    for rows in batches:
        n = len(rows)
        sub = copy.copy(case)
        sub.tokens, sub.positions, sub.blocks = ([getattr(case, f)[i] for i in rows] for f in ("tokens", "positions", "blocks"))
        sub.tokens = [rng.randrange(model.config.vocab_size) for _ in rows]
        expected, _ = sub.expected(model)
        calls, replays = len(spy.calls), len(spy.replays)
        logits = runner.run(sub.tokens, sub.positions, sub.blocks)
        assert tuple(logits.shape) == (n, model.config.vocab_size), (
            f"{what}: run() of {n} sequences returned logits of shape {tuple(logits.shape)}, expected [{n}, "
            f"{model.config.vocab_size}]: the real rows only ({HINTS}, DecodeGraphs.run, hint 1).")
        diff = max_diff(logits, expected)
        assert diff < 1e-3, (
            f"{what}: run() of {n} sequences gave logits {diff:.3g} from exercise 5's forward over the same step. "
            + ("A replay reads the buffers the graph was captured with: the step's values must be copied into those "
               "very tensors, and the graph replayed after the copy " if runner_uses_graphs(spy) else "")
            + f"({HINTS}, DecodeGraphs.run, hint 1).")
        widest = max(len(b) for b in sub.blocks)
        yield Ran(n, reference.padded_size(n, sizes), reference.padded_size(widest, widths), widest, spy.calls[calls:],
                  spy.replays[replays:])


def runner_uses_graphs(spy):
    return bool(spy.captures())


def test_11c_one_graph_per_capture_size_replayed_each_step(student, model, seed, monkeypatch):
    """One graph per capture size and table width, captured when the runner is built (after a warm-up, the largest
    first, one shared pool); then a step of each batch size, each replaying one graph: its padded size's, at the
    narrowest width that holds its widest table."""
    max_batch = 6
    case, spy, runner = runner_case(student, model, seed, max_batch, True, monkeypatch)
    what = f"DecodeGraphs(max_batch_size={max_batch}, use_graphs=True)" + ("" if model.device.type == "cuda" else " on the CPU stand-in")
    sizes, widths = runner.sizes, runner.widths  # capture_sizes(max_batch) and capture_widths(max_blocks): given
    pairs = sorted((size, width) for size in sizes for width in widths)
    captured = sorted((size, width) for size, width, g in spy.calls if g is not None)
    assert captured == pairs, (
        f"{what}: decode_step was captured at (size, width) {captured}, expected each pair of a size in {sizes} and a "
        f"width in {widths} once: one graph per capture size and table width, captured when the runner is built "
        f"({HINTS}, DecodeGraphs.capture, hint 1).")
    assert sorted(runner.graphs) == pairs, (
        f"{what}: runner.graphs holds the keys {sorted(runner.graphs)}, expected the pairs (size, width) {pairs}: each "
        f"graph is kept under its (size, width) ({HINTS}, DecodeGraphs.capture, hint 2).")
    order = [(size, width) for size, width, g in spy.calls if g is not None]
    assert order[0] == pairs[-1], (
        f"{what}: captured (size, width) in the order {order[:8]} ...: capture the largest first, {pairs[-1]}, so that "
        f"the shared pool is sized by it and the others fit inside ({HINTS}, DecodeGraphs.capture, hint 2).")
    first_capture = next(i for i, (_, _, g) in enumerate(spy.calls) if g is not None)
    assert first_capture > 0, (
        f"{what}: the first capture came before any step ran: warm up first (graphs.warmup), so that what the first "
        f"call sets up lazily is not recorded ({HINTS}, DecodeGraphs.capture, hint 2).")
    captures = spy.captures()
    pools = [pool for _, pool in captures[1:]]
    shared = {id(g): g.pool() for g, _ in captures}
    assert all(pool is not None and pool in shared.values() for pool in pools) and len(set(map(repr, pools))) <= 1, (
        f"{what}: the graphs after the first were captured with pools {pools[:4]} ...: every graph must share one memory "
        f"pool (pass the first graph's graph.pool() to every later capture), as only one replays at a time ({HINTS}, "
        f"DecodeGraphs.capture, hint 2).")
    check_replays(student, model, case, spy, runner, seed, what)


def check_replays(student, model, case, spy, runner, seed, what, batches=None):
    """Each step (of run_steps) replays one graph, its padded size's at its width, and calls no decode_step."""
    key_of = spy.key_of()
    for step in run_steps(student, model, case, spy, runner, seed, what, batches=batches):
        assert not step.calls, (
            f"{what}: run() of {step.n} sequences called decode_step {len(step.calls)} time(s): with graphs a step replays "
            f"the captured one, and runs no Python of the step ({HINTS}, DecodeGraphs.run, hint 1).")
        got = [key_of.get(id(g)) for g in step.replays]
        assert got == [(step.size, step.width)], (
            f"{what}: run() of {step.n} sequences whose widest table has {step.widest} blocks replayed the graphs of "
            f"(size, width) {got}, expected one replay of {(step.size, step.width)}: the smallest capture size that holds "
            f"{step.n} rows, at the narrowest of the widths {runner.widths} that holds the widest table (a wider graph "
            f"attends to masked keys for nothing, a narrower one cuts keys off) ({HINTS}, DecodeGraphs.run, hint 1).")


def test_11c_replays_the_narrowest_width_that_holds_the_widest_table(student, model, seed, monkeypatch):
    """Steps whose widest table is exactly a capture width, one block past one, a single block and the whole context,
    the widest table not always the first: each replays its padded size's graph at the narrowest capture width that
    holds its widest table, with exercise 5's logits."""
    block_size = 8  # tables of 1, 2, 3, 4, 5, 8, 9, 33 blocks, and the whole context's (its last position)
    lengths = [7, 8, 23, 31, 32, 63, 64, 262, model.config.n_positions - 1]
    case = Case(model, len(lengths), seed, block_size=block_size, lengths=lengths)
    spy = Spy(student, monkeypatch)
    runner = student.DecodeGraphs(model, case.cache, 6, case.max_blocks, case.scratch, use_graphs=True)
    what = f"DecodeGraphs(max_batch_size=6, max_blocks={case.max_blocks}, use_graphs=True), blocks of {block_size}"
    batches = [[0], [1], [0, 2], [3, 0], [0, 4], [5], [1, 6, 0], [0, 7], [8], [0, 1, 2, 3, 4, 5]]
    check_replays(student, model, case, spy, runner, seed, what, batches)


def test_11c_runs_eagerly_without_graphs(student, model, seed, monkeypatch):
    max_batch = 5
    case, spy, runner = runner_case(student, model, seed, max_batch, False, monkeypatch)
    what = f"DecodeGraphs(max_batch_size={max_batch}, use_graphs=False)"
    assert not spy.captures() and not spy.calls, (
        f"{what}: captured or ran {len(spy.calls)} step(s) when built: without graphs nothing is captured.")
    for step in run_steps(student, model, case, spy, runner, seed, what):
        n, padded, calls, replays = step.n, step.size, step.calls, step.replays
        assert not replays and [size for size, _, _ in calls] == [padded], (
            f"{what}: run() of {n} sequences ran decode_step at sizes {[s for s, _, _ in calls]} and replayed "
            f"{len(replays)} graph(s): without graphs, one eager step at the padded size {padded}.")
        widths = [w for _, w, _ in calls]
        assert widths == [step.widest], (
            f"{what}: run() of {n} sequences whose longest table has {step.widest} blocks ran decode_step at width "
            f"{widths[0]}: eagerly, read only the widest table's blocks (every key read costs a CPU time; only a graph "
            f"needs a fixed width, one of the widths captured) ({HINTS}, DecodeGraphs.run, hint 2).")


def test_11c_a_batch_past_the_largest_size_is_refused(student, model, seed, monkeypatch):
    case, spy, runner = runner_case(student, model, seed, 3, False, monkeypatch)
    more = Case(model, 4, seed + 1, block_size=8)
    with pytest.raises(ValueError):
        runner.run(more.tokens, more.positions, more.blocks)
        pytest.fail("DecodeGraphs(max_batch_size=3).run() of 4 sequences returned: no graph and no buffer holds them; "
                    "raise ValueError (padded_size does).")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (the CPU stand-in is checked above)")
def test_11c_graphs_on_cuda(student, model, seed, monkeypatch, device):
    if torch.device(device).type != "cuda":
        pytest.skip("the model is not on CUDA")
    max_batch = 6
    case, spy, runner = runner_case(student, model, seed, max_batch, None, monkeypatch)
    assert spy.captures(), "DecodeGraphs(use_graphs=None) on CUDA captured nothing: graphs are the default there."
    for step in run_steps(student, model, case, spy, runner, seed, "DecodeGraphs on CUDA"):
        assert not step.calls, (f"run() of {step.n} sequences on CUDA ran decode_step eagerly: replay the graph of "
                                f"{(step.size, step.width)}.")


@pytest.mark.timing
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the launch overhead a graph removes is a GPU's, a CPU has none to save")
def test_11c_replay_is_faster_than_eager_at_batch_1(student, model, seed, monkeypatch, device):
    if torch.device(device).type != "cuda":
        pytest.skip("the model is not on CUDA")
    case = Case(model, 1, seed, block_size=16)
    graphed = student.DecodeGraphs(model, case.cache, 1, case.max_blocks, case.scratch, use_graphs=True)
    eager = student.DecodeGraphs(model, copy.deepcopy(case.cache), 1, case.max_blocks, case.scratch, use_graphs=False)
    args = (case.tokens, case.positions, case.blocks)
    timing = paired_timing(lambda: [graphed.run(*args) for _ in range(20)], lambda: [eager.run(*args) for _ in range(20)],
                           repeats=7, warmup=2, device=device)
    assert timing.ratio < 1 / 1.5, (
        f"a replayed decode step at batch 1 took {timing.ratio:.2f}x the eager one's time ({timing.report('graph', 'eager')}): "
        f"expected at least 1.5x faster. Is every step replayed, and nothing synchronising inside run()?")


# ----------------------------------------------------------------------------------------------
# 11d: the engine on it

def requests_of(prompts, max_new_tokens, **fields):
    return [paged.Request(list(p), m, **fields) for p, m in zip(prompts, max_new_tokens)]


def serve(student, model, requests, max_batch, cuda_graphs, spy=None, **options):
    engine = student.Engine(model, max_batch, cuda_graphs=cuda_graphs, eos_token_id=NO_EOS, **options)
    steps = []
    if spy is not None:
        run_model = engine.run_model

        def watched(scheduled):
            before = len(spy.replays)
            logits = run_model(scheduled)
            steps.append(([n for _, n in scheduled], spy.replays[before:]))
            return logits

        engine.run_model = watched
    return engine.run(requests), steps


def workload_of(model, seed, count=10):
    return mixed_workload(model, count, prompt_len=(1, 40), output_len=(1, 30), seed=seed + 11)


def check_same_tokens(got, expected, prompts, model, tokenizer, what, sampled):
    for i, (g, e, prompt) in enumerate(zip(got.outputs, expected.outputs, prompts)):
        problem = (None if g == e else f"continuation {i}: {g} against {e}") if sampled else compare_tokens(g, e, model, prompt, tokenizer)
        assert problem is None, (
            f"{what}: continuation {i} differs from exercise 5's engine on the same requests:\n{problem}\nDecode steps "
            f"through the graphs must give the tokens the eager step gives ({HINTS}, Engine.run_model, hint 1).")


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_11d_same_tokens_as_exercise_5_with_decode_steps_on_graphs(student, model, tokenizer, seed, monkeypatch, sampled):
    work = workload_of(model, seed)
    fields = {"sampling": SamplingParams(top_k=10, seed=seed)} if sampled else {}
    expected = paged.generate(model, requests_of(work.prompts, work.max_new_tokens, **fields), 4, eos_token_id=NO_EOS)
    spy = Spy(student, monkeypatch)
    got, steps = serve(student, model, requests_of(work.prompts, work.max_new_tokens, **fields), 4, True, spy)
    what = "Engine(max_batch_size=4, cuda_graphs=True)" + (" with seeded top-k sampling" if sampled else "")
    check_same_tokens(got, expected, work.prompts, model, tokenizer, what, sampled)
    for i, (ns, replays) in enumerate(steps):
        decode_only = all(n == 1 for n in ns)
        assert len(replays) == (1 if decode_only else 0), (
            f"{what}: step {i} computed {ns} tokens per sequence and replayed {len(replays)} graph(s): a decode-only "
            f"step (one token per sequence) replays exactly one graph; a step with a prompt or a chunk runs eagerly, "
            f"since its shapes are not the graph's ({HINTS}, Engine.run_model, hint 1).")


def test_11d_preemption_parallel_sampling_and_prefix_caching_on_graphs(student, model, tokenizer, seed, monkeypatch):
    """A pool too small for everyone (preemption), n = 2 continuations and prefix caching, with graphs."""
    rng = random.Random(seed)
    prefix = [rng.randrange(model.config.vocab_size) for _ in range(20)]  # five full blocks every prompt shares
    tails = [rng.choice([3, 5, 6, 7, 9]) for _ in range(8)]  # a partly filled last block: the forks copy it
    prompts = [prefix + [rng.randrange(model.config.vocab_size) for _ in range(k)] for k in tails]
    new_tokens = [rng.randint(24, 40) for _ in prompts]  # four running need more blocks than the pool has: preemption
    reqs = lambda: [paged.Request(list(p), m, n=1 + i % 2, sampling=SamplingParams(top_k=10, seed=seed + i))
                    for i, (p, m) in enumerate(zip(prompts, new_tokens))]
    options = dict(num_blocks=20, block_size=4, enable_prefix_caching=True, max_num_batched_tokens=32)
    expected = paged.generate(model, reqs(), 4, eos_token_id=NO_EOS, **options)
    assert expected.stats.preemptions and expected.stats.prefix_hit_tokens and expected.stats.copies, "the workload must preempt, hit and copy"
    got, _ = serve(student, model, reqs(), 4, True, **options)
    what = f"Engine(max_batch_size=4, cuda_graphs=True, {options})"
    check_same_tokens(got, expected, prompts, model, tokenizer, what, True)
    assert (got.stats.num_blocks, got.stats.preemptions, got.finish_order, got.stats.blocks_in_use) == (
        expected.stats.num_blocks, expected.stats.preemptions, expected.finish_order, expected.stats.blocks_in_use), (
        f"{what}: a pool of {got.stats.num_blocks} blocks, {got.stats.preemptions} preemptions, sequences finishing in "
        f"the order {got.finish_order}, blocks in use per step {got.stats.blocks_in_use[:8]}...; exercise 5's engine: "
        f"{expected.stats.num_blocks}, {expected.stats.preemptions}, {expected.finish_order}, "
        f"{expected.stats.blocks_in_use[:8]}.... The graphs' scratch block comes on top of the allocator's blocks, never out of them: "
        f"the engine schedules exactly as exercise 5's ({HINTS}, Engine.__init__, hint 1).")


def test_11d_a_sequence_up_to_the_context_on_graphs(student, model, tokenizer, seed):
    """One prompt that fills the context but for 20 tokens, beside a short one: the graphs' tables hold a whole
    context."""
    work = workload_of(model, seed, count=2)
    long = (work.prompts[0] * model.config.n_positions)[:model.config.n_positions - 20]
    prompts, new = [long, work.prompts[1]], [20, 12]
    expected = paged.generate(model, requests_of(prompts, new), 2, eos_token_id=NO_EOS)
    got, _ = serve(student, model, requests_of(prompts, new), 2, True)
    check_same_tokens(got, expected, prompts, model, tokenizer, "Engine(max_batch_size=2, cuda_graphs=True) with a prompt "
                      f"of {plural(len(long), 'token')} (the context is {model.config.n_positions})", False)


def test_11d_graphs_only_on_cuda_by_default(student, model, seed, monkeypatch, device):
    work = workload_of(model, seed, count=3)
    spy = Spy(student, monkeypatch)
    serve(student, model, requests_of(work.prompts, work.max_new_tokens), 2, None)
    on_cuda = torch.device(device).type == "cuda"
    assert bool(spy.captures()) == on_cuda, (
        f"Engine(cuda_graphs=None) with the model on {device} captured {len(spy.captures())} graph(s): by default graphs "
        f"are used on CUDA only (on a CPU there are no launches to save, and the stand-in is slower) ({HINTS}, Engine.__init__, hint 1).")
    spy = Spy(student, monkeypatch)
    serve(student, model, requests_of(work.prompts, work.max_new_tokens), 2, False)
    assert not spy.captures(), "Engine(cuda_graphs=False) captured a graph: False means never."


# ----------------------------------------------------------------------------------------------
# Differential checks: generated scenarios biased to the edges, the same calls on the reference and on yours,
# compared after every call on what the contract promises (workshop/grading/differential.py)

LOGITS = Tolerance(1e-4, 1e-4)  # fp32 logits of a small model: another order of additions, another attention kernel


@st.composite
def size_scenarios(draw):
    """A max_batch_size around powers of two; n at, and one either side of, each capture size (0 and the largest + 1
    included); the sizes handed over sorted, reversed or shuffled."""
    max_batch = draw(around(1, 2, 4, 8, 16, low=1, high=33))
    sizes = reference.capture_sizes(max_batch)
    ns = draw(st.lists(st.sampled_from(sorted({x for s in sizes for x in (s - 1, s, s + 1)} | {0})), min_size=1, max_size=6))
    order = draw(st.sampled_from(["sorted", "reversed", "shuffled"]))
    return max_batch, ns, order, draw(st.randoms(use_true_random=False))


def test_11a_differential_padded_size(student, seed):
    """capture_sizes and capture_widths for generated maximum batch sizes (and table widths), then padded_size at each
    capture size and one either side (ValueError below 1 and past the largest), with the sizes in any order: the value
    and its type, the error class, the list of sizes unchanged."""
    def check(scenario):
        max_batch, ns, order, rng = scenario
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, padded_size, hint 1.")
        twins.call(f"capture_sizes({max_batch})", lambda side: side.capture_sizes(max_batch))
        twins.call(f"capture_widths({max_batch})", lambda side: side.capture_widths(max_batch))
        sizes = reference.capture_sizes(max_batch)
        sizes = sizes[::-1] if order == "reversed" else rng.sample(sizes, len(sizes)) if order == "shuffled" else sizes
        for n in ns:
            twins.call(f"padded_size({n}, {sizes})", lambda side, sizes: side.padded_size(n, sizes), inputs=(sizes,))

    explore(size_scenarios(), check, seed=seed, examples=60, edges=size_edges())


def size_edges():
    """Tried first at every seed (issue 41): max_batch_size 1 (one capture size) with n 0, 1 and 2; 8, a power of two,
    shuffled, n one either side of it and 0; 33, one past a power of two, reversed. (Made at each call: the shuffle
    consumes its random source.)"""
    return [(1, [0, 1, 2], "sorted", random.Random(0)), (8, [9, 8, 7, 1, 0], "shuffled", random.Random(1)),
            (33, [34, 33, 32, 17, 3], "reversed", random.Random(2))]


class InputsObserver:
    """What StaticInputs promises after each fill of n rows padded to size: rows < n's values (input_ids, positions,
    slots, context_lens and each table's own entries), the padding rows' promise (a slot in the scratch block, at
    least one key, every key seen in the scratch block), and the five buffers still the tensors __init__ made
    (address, shape, dtype). The values past a row's own blocks and past `size` are free, and not read."""

    def __init__(self):
        self.built, self.step = {}, ([], [], [], None)

    def __call__(self, inputs):
        tokens, positions, tables, size = self.step
        now = {name: (t.data_ptr(), tuple(t.shape), t.dtype) for name, t in buffers(inputs).items()}
        first = self.built.setdefault(id(inputs), now)
        n, bs, scratch = len(tokens), inputs.block_size, inputs.scratch_block
        size = inputs.input_ids.shape[0] if size is None else size
        got = {name: t[:size].tolist() for name, t in buffers(inputs).items()}
        padding = [got["slots"][i] // bs == scratch and 1 <= got["context_lens"][i] <= len(got["block_tables"][i]) * bs
                   and set(got["block_tables"][i][:-(-got["context_lens"][i] // bs)]) == {scratch} for i in range(n, size)]
        return {**{name: got[name][:n] for name in ("input_ids", "positions", "slots", "context_lens")},
                "each table's own entries": [row[:len(table)] for row, table in zip(got["block_tables"], tables)],
                "every padded row writes and reads the scratch block only": all(padding),
                "the buffers are the tensors __init__ made": now == first}


@st.composite
def fill_scenarios(draw):
    """StaticInputs for a max_batch_size around powers of two, blocks of 1, 3 or 4, then 1 to 5 fills: batches of 1
    and of each capture size (padded to that size or past it), positions at and around block edges."""
    max_batch, block_size = draw(around(1, 2, 4, low=1, high=9)), draw(st.sampled_from([1, 3, 4]))
    max_blocks, sizes = draw(st.integers(1, 6)), reference.capture_sizes(max_batch)
    fills = []
    for _ in range(draw(st.integers(1, 5))):
        size = draw(st.sampled_from(sizes))
        n = draw(st.sampled_from(sorted({1, size} | {s for s in sizes if s <= size})))
        edge = st.sampled_from([b * block_size + o for b in range(max_blocks) for o in (-1, 0, 1)
                                if 0 <= b * block_size + o < max_blocks * block_size])
        positions = draw(st.lists(st.one_of(edge, st.integers(0, max_blocks * block_size - 1)), min_size=n, max_size=n))
        fills.append((draw(st.lists(token_ids(), min_size=n, max_size=n)), positions, size))
    return max_batch, block_size, max_blocks, fills, draw(st.randoms(use_true_random=False))


def test_11a_differential_fill(student, seed):
    """Generated StaticInputs filled several times, by hand: after __init__ and after every fill, the values the
    contract promises (the reference's on the real rows; the padding's promise; the same buffers throughout), the
    caller's lists unchanged."""
    def check(scenario):
        max_batch, block_size, max_blocks, fills, rng = scenario
        scratch = max_batch * max_blocks + 1  # past every sequence's blocks
        observe = InputsObserver()
        mods = Twins(reference, student, hint=f"Hint: see {HINTS}, StaticInputs.fill, hints 1 and 2.")
        inputs = mods.call(f"StaticInputs(max_batch_size={max_batch}, max_blocks={max_blocks}, block_size={block_size}, "
                           f"scratch_block={scratch}, device='cpu')",
                           lambda m: m.StaticInputs(max_batch, max_blocks, block_size, scratch, "cpu"), observe=observe,
                           returns=None)
        for tokens, positions, size in fills:
            tables = [rng.sample(range(scratch), p // block_size + 1) for p in positions]
            observe.step = tokens, positions, tables, size
            inputs.call(f"fill({tokens}, {positions}, {tables}, {size})",
                        lambda side, t, p, b: side.fill(t, p, b, size), inputs=(tokens, positions, tables))

    explore(fill_scenarios(), check, seed=seed, examples=50, edges=fill_edges())


def fill_edges():
    """Tried first at every seed (issue 41): one row, one block of one slot, id 0; blocks of 3, two rows at a block's
    last and first positions (EOS, id 0), then a full batch of 4, then one row padded to 4 after it (stale rows)."""
    return [(1, 1, 1, [([0], [0], 1)], random.Random(0)),
            (4, 3, 2, [([50256, 0], [2, 3], 2), ([1, 2, 3, 4], [5, 0, 3, 4], 4), ([7], [0], 4)], random.Random(1))]


class Step:
    """A decode step's state on a small model: n sequences of the given lengths prefilled into a paged cache by
    exercise 5's forward (blocks shuffled over the pool), each about to feed one token; the pool's last block is
    the scratch block, nobody's."""

    def __init__(self, model, block_size, lengths, rng):  # the cache in the model's dtype, as exercise 5's Engine makes it
        vocab = model.config.vocab_size
        self.block_size, self.max_blocks = block_size, -(-model.config.n_positions // block_size)
        need = [-(-(k + 1) // block_size) for k in lengths]
        self.scratch = sum(need) + 2
        pool = rng.sample(range(self.scratch), self.scratch)
        self.blocks = [pool[sum(need[:i]):sum(need[:i + 1])] for i in range(len(lengths))]
        self.cache = paged.PagedKVCache(model.config, self.scratch + 1, block_size, model.device, next(model.parameters()).dtype)
        paged.forward(model, self.cache, [[rng.randrange(vocab) for _ in range(k)] for k in lengths], [0] * len(lengths), self.blocks)
        self.tokens, self.positions = [rng.randrange(vocab) for _ in lengths], list(lengths)


def pools_but_scratch(cache, scratch):
    """Every layer's key and value pools but the scratch block (what padded rows leave there is free)."""
    return [pool[:scratch] for pool in cache.keys + cache.values] + [pool[scratch + 1:] for pool in cache.keys + cache.values]


@st.composite
def step_scenarios(draw, max_n=4):
    """A small model (heads, widths, layers and context unlike tiny's), blocks of 1, 3 or 4, 1 to max_n sequences
    whose lengths sit at and around block edges (a token that opens a new block), at and around the edges of the
    capture widths (a table of exactly 2 or 4 blocks, or one more), and near the context's end; the model in a drawn dtype."""
    config, block_size = draw(small_config(max_layers=2, n_positions=(16, 24, 32))), draw(st.sampled_from([1, 3, 4]))
    top = config.n_positions - 1
    length = st.one_of(around(block_size, 2 * block_size, 4 * block_size, low=1, high=top), st.sampled_from([top - 1, top]))
    lengths = draw(st.lists(length, min_size=1, max_size=max_n))
    return config, block_size, lengths, draw(st.randoms(use_true_random=False)), draw(dtypes())


def test_11b_differential(student, seed):
    """Generated decode steps through decode_step on the reference's StaticInputs, padded to each capture size that
    holds them, at the full table width and at the widest table's: the logits' shape, the real rows' logits, and
    every block of the pools but the scratch block afterwards, against the reference's; the inputs unchanged."""
    def check(scenario):
        config, block_size, lengths, rng, dtype = scenario
        model = small_model(config, dtype=dtype)
        case = Step(model, block_size, lengths, rng)
        n = len(lengths)
        size = rng.choice([s for s in reference.capture_sizes(max(n, 4)) if s >= n])
        width = rng.choice([case.max_blocks, max(len(b) for b in case.blocks)])
        inputs = reference.StaticInputs(size, case.max_blocks, block_size, case.scratch, "cpu")
        inputs.fill(case.tokens, case.positions, case.blocks, size)
        before = {name: t.clone() for name, t in buffers(inputs).items()}

        def step(side):
            cache, mine = copy.deepcopy(case.cache), copy.deepcopy(inputs)
            logits = side.decode_step(model, cache, mine, size, width)
            return {"logits' shape": tuple(logits.shape), "the real rows' logits": logits[:n],
                    "the pools but the scratch block": pools_but_scratch(cache, case.scratch),
                    "the inputs' buffers unchanged": all(torch.equal(t, before[k]) for k, t in buffers(mine).items())}

        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, decode_step, hint 2.", tol=tolerance(dtype, LOGITS))
        twins.call(f"decode_step(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, context "
                   f"{config.n_positions}; {n} sequences of lengths {lengths} in blocks of {block_size}, tables {case.blocks}, "
                   f"feeding {case.tokens}; padded to size={size}, width={width})", step, again=True)

    explore(step_scenarios(), check, seed=seed, examples=15, edges=step_edges())


_CONTEXT_16 = gpt.GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2)


def step_edges():
    """Tried first at every seed (issue 41): blocks of 4, a sequence of exactly one block (its token opens a new one),
    one at the context's last position, one of one token."""
    return [(_CONTEXT_16, 4, [4, 15, 1], random.Random(0), torch.float32)]


def observe_runner(runner):
    """A DecodeGraphs: the (size, width) pairs it holds graphs for, how often each was replayed (the CPU stand-in
    counts), and the pools but the scratch block."""
    return {"graphs (size, width)": sorted(runner.graphs),
            "replays per (size, width)": {key: getattr(g, "replays", None) for key, g in sorted(runner.graphs.items())},
            "the pools but the scratch block": read(pools_but_scratch(runner.cache, runner.inputs.scratch_block))}


def test_11c_differential(student, seed):
    """Generated DecodeGraphs, with graphs (the CPU stand-in) or without, at the default table widths or given ones
    (the full width alone, a few without it: ValueError for a wider table), run by hand over decode steps of random
    subsets of the sequences (every batch size, and one past the largest: ValueError): after building and after
    every run, the logits of the real rows, the (size, width) graphs held and how often each replayed, and the pools
    but the scratch block."""
    def check(scenario):
        config, block_size, lengths, rng, dtype = scenario
        model = small_model(config, dtype=dtype)
        case = Step(model, block_size, lengths, rng)
        max_batch, use_graphs = rng.randint(max(1, len(lengths) - 1), len(lengths)), rng.random() < 0.6
        few = sorted(rng.sample(range(1, case.max_blocks + 1), min(case.max_blocks, rng.randint(1, 3))))
        widths = rng.choice([None, None, None, [case.max_blocks], few])
        mods = Twins(reference, student, hint=f"Hint: see {HINTS}, DecodeGraphs.capture and DecodeGraphs.run.", tol=tolerance(dtype, LOGITS))
        runner = mods.call(f"DecodeGraphs(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, "
                           f"context {config.n_positions}; a cache of blocks of {block_size}, max_batch_size={max_batch}, "
                           f"max_blocks={case.max_blocks}, scratch_block={case.scratch}, use_graphs={use_graphs}, widths={widths})",
                           lambda m: m.DecodeGraphs(model, copy.deepcopy(case.cache), max_batch, case.max_blocks, case.scratch,
                                                    use_graphs=use_graphs, widths=widths), observe=observe_runner, returns=None)
        for _ in range(3):
            n = rng.randint(1, len(lengths))
            rows = sorted(rng.sample(range(len(lengths)), n))
            tokens = [rng.randrange(config.vocab_size) for _ in rows]
            positions, tables = [case.positions[i] for i in rows], [case.blocks[i] for i in rows]
            runner.call(f"run({tokens}, {positions}, {tables})", lambda r, t, p, b: r.run(t, p, b), inputs=(tokens, positions, tables))

    explore(step_scenarios(max_n=5), check, seed=seed, examples=8, edges=runner_edges())


def runner_edges():
    """Tried first at every seed (issue 41), one scenario (a DecodeGraphs captures every size): five sequences in blocks
    of 3, at and one either side of block edges and at the context's last position."""
    return [(_CONTEXT_16, 3, [3, 6, 7, 14, 15], random.Random(1), torch.float32)]


def observe_engine(engine):
    """An engine after a step: each sequence's tokens (greedy: near ties tolerated), the finished in order, the
    allocator's blocks and free blocks, preemptions, steps, and the graph replays so far (one per decode-only step
    with graphs: for exercise 5's engine, counted by the check)."""
    replays = getattr(engine, "expected_replays", None)
    if replays is None:
        replays = sum(g.replays for g in engine.graphs.graphs.values()) if engine.graphs is not None else 0
    return {"each sequence's tokens": [GreedyTokens(list(s.output_ids), engine.model, tuple(s.request.prompt_ids))
                                       for s in engine.sequences],
            "finished, in order": [s.id for s in engine.finished], "blocks in the allocator": engine.allocator.num_blocks,
            "free blocks": engine.allocator.num_free_blocks, "preemptions": engine.stats.preemptions,
            "steps": engine.stats.steps, "graph replays": replays}


def iteration(engine):
    """One turn of exercise 5's Engine.run, by hand: wait for the next arrival if idle, one step, the step index on."""
    if engine.start is None:
        engine.start = time.perf_counter()
    if not engine.waiting and not engine.running:
        engine.wait_for_next_arrival()
    engine.step()
    engine.step_index += 1


@st.composite
def engine_scenarios(draw):
    """A small model, blocks of 1, 3 or 4, 1 to 3 requests (prompts at and around block edges, one may end exactly at
    the context's end, late arrivals), max_batch_size 1 to 3, a token budget, a pool sometimes small enough to
    preempt, cuda_graphs True, False or None (on a CPU: none); the model in a drawn dtype."""
    config, block_size = draw(small_config(max_layers=2)), draw(st.sampled_from([1, 3, 4]))
    requests = []
    for _ in range(draw(st.integers(1, 3))):
        new = draw(around(1, block_size, low=1, high=6))
        prompt = draw(st.one_of(around(block_size, 2 * block_size, low=1, high=12), st.just(config.n_positions - new)))
        requests.append((prompt, new, draw(st.integers(0, 3))))
    longest = max(-(-(p + m - 1) // block_size) for p, m, _ in requests)
    num_blocks = draw(st.sampled_from([None, longest, longest + 2]))
    return (config, block_size, requests, draw(st.integers(1, 3)), draw(st.sampled_from([3, 8, 64])), num_blocks,
            draw(st.sampled_from([True, True, False, None])), draw(st.integers(0, 2 ** 16)), draw(dtypes()))


def test_11d_differential(student, seed):
    """Generated requests served by your Engine and by exercise 5's reference engine, stepped by hand and observed after
    EVERY step (idle steps before late arrivals included): the same tokens, finish order, blocks, preemptions and
    steps, and one graph replay per decode-only step when graphs are on; then generate() against the reference's."""
    def check(scenario):
        config, block_size, plan, max_batch, budget, num_blocks, cuda_graphs, g_seed, dtype = scenario
        model = small_model(config, dtype=dtype)
        rng = random.Random(g_seed)
        prompts = [[rng.randrange(config.vocab_size) for _ in range(p)] for p, _, _ in plan]
        options = dict(block_size=block_size, max_num_batched_tokens=max(budget, max_batch), num_blocks=num_blocks)
        graphs_on = bool(cuda_graphs)  # the model is on the CPU: None means no graphs

        def build(m):
            if m is not paged:
                return m.Engine(model, max_batch, cuda_graphs=cuda_graphs, eos_token_id=NO_EOS, **options)
            engine = paged.Engine(model, max_batch, eos_token_id=NO_EOS, **options)
            engine.expected_replays, run_model = 0, engine.run_model

            def counted(scheduled):  # what the graphs should replay: each decode-only step, when they are on
                engine.expected_replays += graphs_on and all(n == 1 for _, n in scheduled)
                return run_model(scheduled)

            engine.run_model = counted
            return engine

        mods = Twins(paged, student, hint=f"Hint: see {HINTS}, Engine.__init__ and Engine.run_model.")
        engine = mods.call(f"Engine(a {dtype_name(dtype)} model of {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, context "
                           f"{config.n_positions}; max_batch_size={max_batch}, cuda_graphs={cuda_graphs}, {options}) (exercise "
                           f"5's Engine on the reference's side)", build, observe=observe_engine, returns=None)
        for prompt, (_, new, arrival) in zip(prompts, plan):
            engine.call(f"add_request(Request({plural(len(prompt), 'token')}, max_new_tokens={new}, arrival_step={arrival}))",
                        lambda e: e.add_request(paged.Request(list(prompt), new, arrival_step=arrival)), returns=None)
        for _ in range(200):
            if not (engine.reference.pending or engine.reference.waiting or engine.reference.running):
                break
            engine.call(f"step() (step index {engine.reference.step_index})", iteration)
        requests = lambda: [paged.Request(list(p), new, arrival_step=a) for p, (_, new, a) in zip(prompts, plan)]
        mods.call("generate(the same requests)",
                  lambda m: [GreedyTokens(out, model, tuple(p)) for out, p in zip(
                      (paged.generate(model, requests(), max_batch, NO_EOS, **options) if m is paged else
                       m.generate(model, requests(), max_batch, cuda_graphs=cuda_graphs, eos_token_id=NO_EOS, **options)).outputs, prompts)])

    explore(engine_scenarios(), check, seed=seed, examples=10, edges=ENGINE_EDGES)


# Tried first at every seed (issue 41), one scenario (an engine run is the costly kind): one seat, a request that ends
# exactly at the context's end on a pool of exactly its blocks, a late one of exactly a block, the budget 3, graphs on.
ENGINE_EDGES = [(_CONTEXT_16, 4, [(12, 4, 0), (4, 1, 2)], 1, 3, 4, True, 0, torch.float32)]
