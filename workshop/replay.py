"""Module 11's measurements (bench/cuda_graphs.py): what a decode step launches, eager against replayed
steps, exercise 5's engine with and without graphs, and the padding that capture sizes cost.

    aten_ops(fn)            every ATen operation one call runs (refusing nothing, unlike workshop.graphs.trace),
                            each with whether it is a view (a view launches no kernel on a GPU)
    op_counts(ops)          how many, how many launch a kernel, and how many of each kind (KINDS)
    kernels_per_step(...)   exercise 5's forward and exercise 11's decode_step at one batch size, counted; whether
                            workshop.graphs.trace accepts each (exercise 5's forward: no, its boolean index runs nonzero)
    DecodeCase              max_batch sequences of `context` tokens in one paged pool, with a scratch block, the
                            runners of exercise 11 over it (eager and on graphs), and the step paths to time
    time_paths(paths, ...)  every path once per round in a rotating order, `steps` calls per sample, synchronised;
                            medians and the per-round ratios to the first path
    width_buckets(case, n)  a replayed step of n sequences at the full table width against its width bucket: the
                            width, the keys a row attends to, the ATen ops, the wall clock taking turns
    engine_runs(...)        exercise 5's engine against exercise 11's (graphs off, graphs on) on one workload,
                            taking turns; tokens/s, ratios, outputs identical, the decode steps' batch sizes
    padding(...)            rows computed per real row when batches are padded up to a capture size, for several
                            lists of sizes and for the best list of each length (a uniform mix of batch sizes, or
                            the batch sizes a run really had)

Wall clock is only ever compared within one process, as ratios of runs that took turns (a median over rounds).
"""

import gc
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workshop import graphs
from workshop.grading.harness import count_torch_ops, synchronize
from workshop.serving import runs as serving
from workshop.serving.bench import take_turns

# What each ATen op of a decode step is, for counting (first match wins; views are told apart first)
KINDS = [
    ("matmul", ("addmm", "mm", "bmm", "baddbmm", "linear", "matmul")),
    ("attention", ("scaled_dot_product", "softmax")),
    ("layer norm", ("layer_norm",)),
    ("gather / scatter", ("index", "embedding", "gather", "scatter", "nonzero", "masked_select")),
    ("new tensors, host copies", ("lift_fresh", "scalar_tensor", "arange", "zeros", "empty", "full", "ones", "copy", "clone",
                                  "_to_copy")),
    ("elementwise", ("add", "sub", "mul", "div", "gelu", "tanh", "pow", "where", "masked_fill", "lt", "le", "gt", "ge", "eq",
                     "ne", "bitwise", "neg", "exp")),
]
VIEW = "views (no kernel)"


def kind(name, is_view=False):
    """The kind of an ATen op named like 'aten.addmm.default'."""
    if is_view:
        return VIEW
    base = name.split(".")[1] if name.startswith("aten.") else name
    for label, stems in KINDS:
        if any(base.startswith(s) or s in base.split("_") or ("_" in s and s in base) for s in stems):
            return label
    return "other"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self.ops.append((str(func), bool(getattr(func, "is_view", False))))
        return func(*args, **(kwargs or {}))


def aten_ops(fn, *args, **kwargs):
    """(fn's result, [(op name, is a view)]) for every ATen op one call of fn runs."""
    with _Ops() as counter:
        result = fn(*args, **kwargs)
    return result, counter.ops


def op_counts(ops):
    kinds = Counter(kind(name, view) for name, view in ops)
    views = kinds.get(VIEW, 0)
    return {"aten_ops": len(ops), "views": views, "kernels": len(ops) - views, "by_kind": dict(kinds.most_common()),
            "by_op": dict(Counter(name for name, _ in ops).most_common())}


# ----------------------------------------------------------------------------------------------
# The step paths over one paged pool


class DecodeCase:
    """max_batch sequences, each `context` tokens long (its next token at position context - 1), their blocks
    side by side in one exercise 5 pool with one more block, the scratch block, that nobody owns. Builds
    exercise 11's runners over it: `eager` (use_graphs=False) and `replayed` (use_graphs=True: CUDA graphs on
    CUDA, workshop.graphs' CPU stand-in elsewhere)."""

    def __init__(self, ex5, ex11, model, max_batch, context, block_size=16, seed=0, graphs_too=True):
        config = model.config
        if context > config.n_positions:
            raise ValueError(f"a context of {context} tokens is past the model's {config.n_positions} positions.")
        self.ex5, self.ex11, self.model = ex5, ex11, model
        self.max_blocks = -(-config.n_positions // block_size)
        used = -(-context // block_size)
        self.scratch = max_batch * used
        dtype = next(model.parameters()).dtype
        self.cache = ex5.PagedKVCache(config, self.scratch + 1, block_size, model.device, dtype)
        self.tables = [list(range(i * used, (i + 1) * used)) for i in range(max_batch)]
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, config.vocab_size, (max_batch,), generator=generator).tolist()
        self.positions = [context - 1] * max_batch
        self.eager = ex11.DecodeGraphs(model, self.cache, max_batch, self.max_blocks, self.scratch, use_graphs=False)
        self.capture_s = self.capture_reserved_bytes = None
        if graphs_too:
            cuda = model.device.type == "cuda"
            synchronize(model.device)
            reserved, start = torch.cuda.memory_reserved(model.device) if cuda else None, time.perf_counter()
            self.replayed = ex11.DecodeGraphs(model, self.cache, max_batch, self.max_blocks, self.scratch, use_graphs=True)
            synchronize(model.device)
            self.capture_s = time.perf_counter() - start
            if cuda:  # what the graphs' memory pool (and the warm-up) took from the device
                self.capture_reserved_bytes = torch.cuda.memory_reserved(model.device) - reserved

    def step(self, n):
        return self.tokens[:n], self.positions[:n], self.tables[:n]

    def paths(self, n):
        """{name: a function running one decode step of n sequences}, each returning logits [n, vocab]:
        ex5       exercise 5's forward (packs the step from Python lists, a boolean index, a table as wide as the longest)
        eager     exercise 11's DecodeGraphs without graphs (buffers filled in place, the widest table's blocks)
        static    the step a one-width graph holds, run eagerly: the batch padded to its capture size, the whole
                  table width (DecodeGraphs' width buckets replay the narrowest width that holds the step instead)
        replayed  DecodeGraphs with graphs: one replay"""
        tokens, positions, tables = self.step(n)
        ex5, ex11, model = self.ex5, self.ex11, self.model
        inputs = self.eager.inputs
        size = ex11.padded_size(n, self.eager.sizes)

        def static():
            inputs.fill(tokens, positions, tables, size)
            return ex11.decode_step(model, self.cache, inputs, size, self.max_blocks)[:n]

        paths = {"ex5": lambda: ex5.forward(model, self.cache, [[t] for t in tokens], positions, tables),
                 "eager": lambda: self.eager.run(tokens, positions, tables),
                 "static": static}
        if getattr(self, "replayed", None) is not None:
            paths["replayed"] = lambda: self.replayed.run(tokens, positions, tables)
        return paths


def kernels_per_step(case, n=1):
    """The ATen ops of one decode step of n sequences: exercise 5's forward, and exercise 11's decode_step (what a graph
    of size padded_size(n) holds) traced by workshop.graphs.trace, with what trace says of exercise 5's forward."""
    tokens, positions, tables = case.step(n)
    ex5, ex11 = case.ex5, case.ex11
    size = ex11.padded_size(n, case.eager.sizes)
    _, ex5_ops = aten_ops(ex5.forward, case.model, case.cache, [[t] for t in tokens], positions, tables)
    torch_ops = count_torch_ops(lambda: ex5.forward(case.model, case.cache, [[t] for t in tokens], positions, tables))
    inputs = case.eager.inputs
    inputs.fill(tokens, positions, tables, size)
    _, step_ops = aten_ops(ex11.decode_step, case.model, case.cache, inputs, size, case.max_blocks)
    _, traced = graphs.trace(ex11.decode_step, case.model, case.cache, inputs, size, case.max_blocks)
    _, fill_ops = aten_ops(inputs.fill, tokens, positions, tables, size)
    try:
        graphs.trace(ex5.forward, case.model, case.cache, [[t] for t in tokens], positions, tables)
        ex5_refused = None
    except graphs.NotCapturable as error:
        ex5_refused = str(error)
    return {"batch": n, "layers": case.model.config.n_layer,
            "ex5_forward": op_counts(ex5_ops), "decode_step": op_counts(step_ops), "fill": op_counts(fill_ops),
            "ex5_forward_torch_ops": torch_ops, "decode_step_traced": len(traced), "ex5_forward_capturable": ex5_refused is None, "ex5_forward_refused": ex5_refused}


def time_paths(paths, repeats=7, steps=5, warmup=2, device="cpu"):
    """Every path once per round, the order rotating from round to round, each sample `steps` calls in a row
    (synchronised before and after), after `warmup` calls of each. Returns {name: {"step_s": median seconds per
    call, "samples_s": [...], "over_first": median over rounds of (first path's time / this one's)}}: over_first > 1
    is faster than the first path."""
    for fn in paths.values():
        for _ in range(warmup):
            fn()
    names = list(paths)
    samples = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                paths[name]()
            synchronize(device)
            samples[name].append((time.perf_counter() - start) / steps)
    first = names[0]
    return {name: {"step_s": statistics.median(s), "samples_s": s,
                   "over_first": statistics.median(a / b for a, b in zip(samples[first], s))} for name, s in samples.items()}


def width_buckets(case, n=1, repeats=9, steps=5):
    """A replayed decode step of the case's first n sequences through two runners over the same pool, both with
    graphs and max_batch_size n: one graph per size at the full table width (widths=[max_blocks], exercise 11
    before width buckets) and the default width buckets (the narrowest capture width that holds the widest
    table). For each: the width replayed, the keys a row attends to (masked or not), the ATen ops of
    decode_step at that width (the same kernels, wider shapes) and the median step; with the median per-round
    ratio of the two taking turns (time_paths: bucket_over_full > 1, the bucket is faster) and their largest
    difference in logits."""
    ex11, model, bs = case.ex11, case.model, case.cache.keys[0].shape[1]
    tokens, positions, tables = case.step(n)
    runners = {"full": ex11.DecodeGraphs(model, case.cache, n, case.max_blocks, case.scratch, use_graphs=True,
                                         widths=[case.max_blocks]),
               "bucket": ex11.DecodeGraphs(model, case.cache, n, case.max_blocks, case.scratch, use_graphs=True)}
    paths = {name: (lambda r=r: r.run(tokens, positions, tables)) for name, r in runners.items()}
    differences = max_difference(paths)
    timed = time_paths(paths, repeats, steps, device=model.device)
    out = {"batch": n, "context": positions[0] + 1, "block_size": bs, "max_blocks": case.max_blocks,
           "widths": runners["bucket"].widths, "bucket_over_full": timed["bucket"]["over_first"]}
    size = ex11.padded_size(n, runners["full"].sizes)
    for name, runner in runners.items():
        width = ex11.padded_size(max(map(len, tables)), runner.widths)
        runner.inputs.fill(tokens, positions, tables, size)
        _, ops = aten_ops(ex11.decode_step, model, case.cache, runner.inputs, size, width)
        out[name] = {"width": width, "keys_per_row": width * bs, "ops": op_counts(ops), "ms": timed[name]["step_s"] * 1e3,
                     "samples_ms": [x * 1e3 for x in timed[name]["samples_s"]], "max_difference": differences[name]}
    return out


def max_difference(paths):
    """The largest difference of each path's logits from the first path's, over one call each."""
    outputs = {name: fn().float().clone() for name, fn in paths.items()}
    first = outputs[next(iter(outputs))]
    return {name: (out - first).abs().max().item() for name, out in outputs.items()}


# ----------------------------------------------------------------------------------------------
# The engine on a serving workload


def engine_runs(ex5, ex11, model, workload, max_batch_size, repeats=3, block_size=16, progress=False):
    """Exercise 5's engine and exercise 11's with graphs off and on (overlap scheduling off: graphs alone), on
    `workload` (every request there at once, the end-of-text ignored), taking turns over `repeats` rounds after a
    warm-up. Returns {"engines": {label: record}, "decode_batch_sizes": [...]} with each engine's median run, its
    ratio to exercise 5 (median of the per-round ratios of seconds: > 1 is faster), and how many outputs equal exercise 5's."""
    from workshop.serving.workloads import mixed_workload

    engines = {
        "ex5": lambda w: serving.run_paged(ex5, model, w, max_batch_size, block_size=block_size),
        "graphs_off": lambda w: serving.run_paged_graphs(ex11, model, w, max_batch_size, cuda_graphs=False, overlap=False,
                                                         label="graphs_off", block_size=block_size),
        "graphs_on": lambda w: serving.run_paged_graphs(ex11, model, w, max_batch_size, cuda_graphs=True, overlap=False,
                                                        label="graphs_on", block_size=block_size),
    }
    def collected(run):  # an engine's pool lives until its reference cycles are collected: gigabytes each on a GPU
        def fresh(w):
            gc.collect()
            if model.device.type == "cuda":
                torch.cuda.empty_cache()
            return run(w)
        return fresh

    engines = {label: collected(run) for label, run in engines.items()}
    warm = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    for run in engines.values():
        run(warm)
    samples = take_turns({label: (lambda run=run: run(workload)) for label, run in engines.items()}, repeats, "engines", progress)
    reference = serving.median_run(samples["ex5"])
    out = {}
    for label, runs in samples.items():
        median = serving.median_run(runs)
        out[label] = {"tokens": median.tokens, "seconds": median.seconds, "tokens_per_s": median.throughput, "steps": median.steps,
                      "seconds_per_round": [r.seconds for r in runs],
                      "over_ex5": statistics.median(a.seconds / b.seconds for a, b in zip(samples["ex5"], runs)),
                      "outputs_identical": min(sum(a == b for a, b in zip(r.outputs, reference.outputs)) for r in runs),
                      "requests": len(workload)}
    stats = reference.result.stats
    decode = [b for b, t in zip(stats.batch_sizes, stats.scheduled_tokens) if b == t]  # one token per sequence: a decode step
    return {"engines": out, "decode_batch_sizes": decode, "steps": stats.steps, "decode_steps": len(decode)}


# ----------------------------------------------------------------------------------------------
# Padding waste against the number of capture sizes


def padded(n, sizes):
    return min(s for s in sizes if s >= n)


def rows_per_real_row(sizes, batches):
    """Rows computed / real rows over `batches` (a list of batch sizes), each padded up to the next of `sizes`."""
    return sum(padded(n, sizes) for n in batches) / sum(batches)


def best_sizes(batches, k, largest):
    """The list of k capture sizes (the largest always among them) that computes the fewest rows over `batches`
    (dynamic programming over the sorted sizes): the most any k graphs can save."""
    weight = Counter(batches)
    below = [0] * (largest + 1)  # below[s]: how many batches have at most s sequences
    for s in range(1, largest + 1):
        below[s] = below[s - 1] + weight[s]
    INF = float("inf")
    # cost[j][s]: fewest rows for the batches <= s with j sizes, the largest of them s
    cost = [[INF] * (largest + 1) for _ in range(k + 1)]
    choice = [[None] * (largest + 1) for _ in range(k + 1)]

    def rows(lo, hi):  # batches in (lo, hi] padded to hi
        return hi * (below[hi] - below[lo])

    for s in range(1, largest + 1):
        cost[1][s] = rows(0, s)
    for j in range(2, k + 1):
        for s in range(j, largest + 1):
            for prev in range(j - 1, s):
                c = cost[j - 1][prev] + rows(prev, s)
                if c < cost[j][s]:
                    cost[j][s], choice[j][s] = c, prev
    sizes, s, j = [], largest, k
    while s is not None and j >= 1:
        sizes.append(s)
        s, j = choice[j][s], j - 1
    return sorted(sizes)


def size_lists(largest, capture_sizes):
    """The capture-size lists compared: exercise 11's powers of two, vLLM's (1, 2, 4, then steps of 8), every
    size, and the largest alone."""
    vllm = sorted({s for s in [1, 2, 4, *range(8, largest + 1, 8)] if s <= largest} | {largest})
    return {"powers_of_two": ("powers of two", capture_sizes(largest)), "vllm": ("steps of 8 (vLLM)", vllm),
            "every_size": ("every size", list(range(1, largest + 1))), "largest_only": ("the largest only", [largest])}


def padding(largest, capture_sizes, measured=None):
    """Rows computed per real row for batch sizes 1..largest each as likely (and, with `measured`, for the decode
    steps' batch sizes of a real run), for each list of size_lists() and for the best list of every length."""
    uniform = list(range(1, largest + 1))
    mixes = {"uniform": uniform, **({"measured": measured} if measured else {})}
    out = {"largest": largest, "lists": {}, "best": {}}
    for name, (label, sizes) in size_lists(largest, capture_sizes).items():
        out["lists"][name] = {"label": label, "sizes": sizes, "graphs": len(sizes), "padded": [padded(n, sizes) for n in uniform],
                              **{mix: rows_per_real_row(sizes, batches) for mix, batches in mixes.items()}}
    for mix, batches in mixes.items():
        out["best"][mix] = [{"graphs": k, "sizes": (best := best_sizes(batches, k, largest)),
                             "rows_per_real_row": rows_per_real_row(best, batches)} for k in range(1, largest + 1)]
    if measured:
        out["measured_batches"] = dict(sorted(Counter(measured).items()))
    return out


def describe_device(device):
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})", "CUDA graphs (torch.cuda.CUDAGraph)"
    return f"{device}, {torch.get_num_threads()} thread(s)", "workshop.graphs.CPUGraph, the CPU stand-in (reruns the captured ATen ops)"

