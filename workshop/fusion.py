"""Module 12's measurements (bench/piecewise_graphs.py): what fusion does to a step's kernels, and the engine with
its pieces compiled, on graphs, or both.

    kernels(ex12, model, tokens)   the kernels one mixed step's pieces run, eager against compiled (torch.profiler):
                                   on CUDA every device kernel; on a CPU the ATen operations that are not views, plus
                                   Inductor's fused C++ kernels (profiled with torch._inductor.config.cpp.enable_kernel_profile)
    engine_runs(...)               exercise 5's engine against exercise 12's in the given configurations, one workload,
                                   taking turns: output tokens/s, each step's mode, outputs identical to exercise 5's
    step_costs(ex5, ex12, model)   where a decode step's time goes, eager against compiled: the pieces, the LM head, a
                                   compiled call's fixed cost and its guard check (why a CPU gains nothing from compiling)
"""

import collections
import contextlib
import time

import torch
from torch.profiler import ProfilerActivity, profile

VIEWS = {"aten::as_strided", "aten::view", "aten::slice", "aten::expand", "aten::t", "aten::transpose", "aten::select",
         "aten::resolve_conj", "aten::empty", "aten::reshape", "aten::alias", "aten::_reshape_alias", "aten::unsqueeze",
         "aten::empty_strided", "aten::detach", "aten::lift_fresh", "aten::split", "aten::permute", "aten::unbind"}


def _top_level_ops(prof):
    """(name) of every kernel-like event on the host: an ATen op that is not a view and that no other ATen op called,
    and every fused kernel Inductor's C++ code reports (cpp_fused_...)."""
    found = []
    for event in prof.events():
        name = event.name
        if "cpp_fused" in name:
            found.append(name)
            continue
        if not name.startswith("aten::") or name in VIEWS:
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                inside = True
                break
            parent = parent.cpu_parent
        if not inside:
            found.append(name)
    return found


def count_kernels(fn, device):
    """The kernels one call of fn runs: {name: count} (see the module's docstring)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        names = _top_level_ops(prof)
    return collections.Counter(names)


@contextlib.contextmanager
def profiled_cpp_kernels():
    """Inductor's C++ kernels report themselves to the profiler (compile inside this)."""
    import torch._inductor.config as inductor

    with inductor.patch({"cpp.enable_kernel_profile": True}):
        yield


def kernels(ex12, model, tokens, seed=0, pieces=None):
    """The pieces of one step of `tokens` tokens (all of them, n_layer + 1 in turn; or only the indices in `pieces`),
    eager and compiled: the kernels each runs, and the seconds the first compiled call took (compiling)."""
    g = torch.Generator().manual_seed(seed)
    inputs = ex12.StepInputs(model.config, tokens, model.device, next(model.parameters()).dtype)
    inputs.fill(torch.randint(model.config.vocab_size, (tokens,), generator=g).to(model.device),
                torch.arange(tokens, device=model.device), tokens)
    pieces = range(model.config.n_layer + 1) if pieces is None else list(pieces)
    eager = count_kernels(lambda: [ex12.run_piece(model, inputs, i, tokens) for i in pieces], model.device)
    with profiled_cpp_kernels():
        piece = ex12.compile_piece()
        start = time.perf_counter()
        for i in pieces:
            piece(model, inputs, i, tokens)
        compile_s = time.perf_counter() - start
        compiled = count_kernels(lambda: [piece(model, inputs, i, tokens) for i in pieces], model.device)
    fused = {name: n for name, n in compiled.items() if "fused" in name}
    return {"tokens": tokens, "pieces": len(pieces), "eager": sum(eager.values()), "compiled": sum(compiled.values()),
            "fused_kernels": sum(fused.values()), "compile_s": compile_s,
            "eager_ops": dict(eager.most_common()), "compiled_ops": dict(compiled.most_common())}


def engine_runs(ex5, ex12, model, workload, max_batch, configs, repeats=3, **options):
    """Exercise 5's engine and exercise 12's in each of `configs` ({label: Engine keyword arguments}) on the same
    requests (the end-of-text ignored), taking turns in a rotating order over `repeats` rounds after one warm-up
    round (which compiles): median output tokens/s, the modes of the last round's steps, outputs as exercise 5's; for
    exercise 5's run, the steps and tokens that were decode-only or mixed ("mix")."""
    def requests():
        return [ex5.Request(list(p), m) for p, m in zip(workload.prompts, workload.max_new_tokens)]

    def run(label):
        if label == "ex5":
            engine = ex5.Engine(model, max_batch, eos_token_id=-1, **options)
        else:
            engine = ex12.Engine(model, max_batch, eos_token_id=-1, **configs[label], **options)
        start = time.perf_counter()
        result = engine.run(requests())
        if torch.device(model.device).type == "cuda":
            torch.cuda.synchronize()
        return result, time.perf_counter() - start, getattr(engine, "modes", [])

    def mix(stats):
        """How many of the run's steps were decode-only (every sequence one token) or mixed, and the tokens of each kind."""
        decode_only = [b == t for b, t in zip(stats.batch_sizes, stats.scheduled_tokens)]
        mixed_tokens = sum(t for t, d in zip(stats.scheduled_tokens, decode_only) if not d)
        tokens = sum(stats.scheduled_tokens)
        return {"steps": len(decode_only), "decode_only": sum(decode_only), "mixed": len(decode_only) - sum(decode_only),
                "tokens": tokens, "mixed_tokens": mixed_tokens, "mixed_tokens_share": mixed_tokens / tokens if tokens else 0.0}

    labels = ["ex5", *configs]
    times, outputs, modes = {label: [] for label in labels}, {}, {}
    for label in labels:  # warm-up: compiles, captures
        run(label)
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            result, seconds, steps = run(label)
            times[label].append(seconds)
            outputs[label], modes[label] = result.outputs, steps
            if label == "ex5":
                steps_mix = mix(result.stats)
    tokens = sum(len(o) for o in outputs["ex5"])
    rows = {}
    for label in labels:
        median = sorted(times[label])[len(times[label]) // 2]
        counted = collections.Counter(modes[label])
        rows[label] = {"tokens_per_s": tokens / median, "seconds": times[label],
                       "modes": {mode: counted.get(mode, 0) for mode in ("full", "piecewise", "eager")},
                       "identical": sum(a == b for a, b in zip(outputs[label], outputs["ex5"])), "requests": len(outputs["ex5"])}
    for label in labels:
        rows[label]["over_ex5"] = rows[label]["tokens_per_s"] / rows["ex5"]["tokens_per_s"]
        steps = sum(rows[label]["modes"].values())
        rows[label]["share_on_graphs"] = (rows[label]["modes"]["full"] + rows[label]["modes"]["piecewise"]) / steps if steps else 0.0
    rows["ex5"]["mix"] = steps_mix
    return rows


def step_costs(ex5, ex12, model, batch=8, context=32, block_size=16, repeats=9, steps=10):
    """Where a step's time goes, eager against compiled (why a CPU gains nothing from compiling the pieces): a decode
    step of `batch` sequences of `context` tokens (the engine's most common step) through exercise 5's forward, the
    piecewise forward with eager pieces and with compiled ones (no graphs), and its parts alone: the n_layer + 1 pieces
    at the step's token count and at 1 token (their fixed cost per call), and the LM head. Taking turns (replay.time_paths:
    medians of `repeats` rounds of `steps` calls). The profiler then splits a compiled call's host time: Dynamo's guard
    check (its "TorchDynamo Cache Lookup" event), the rest. Milliseconds."""
    from workshop import replay

    config, dtype = model.config, next(model.parameters()).dtype
    used = -(-context // block_size)
    cache = ex5.PagedKVCache(config, batch * used + 1, block_size, model.device, dtype)
    tables = [list(range(i * used, (i + 1) * used)) for i in range(batch)]
    g = torch.Generator().manual_seed(0)
    token_ids = [[t] for t in torch.randint(config.vocab_size, (batch,), generator=g).tolist()]
    positions = [context - 1] * batch
    eager = ex12.PiecewiseGraphs(model, cache, batch, use_graphs=False)
    compiled = ex12.PiecewiseGraphs(model, cache, batch, use_graphs=False, compile=True)
    compiled.run(token_ids, positions, tables)  # compiles (every kind of piece)
    pieces = range(config.n_layer + 1)
    inputs = eager.inputs

    def run_pieces(piece, size):
        return lambda: [piece(model, inputs, index, size) for index in pieces]

    for size in (1, batch):  # compiled at both counts before timing
        run_pieces(compiled.run_piece, size)()
    paths = {"ex5_forward": lambda: ex5.forward(model, cache, token_ids, positions, tables),
             "eager": lambda: eager.run(token_ids, positions, tables),
             "compiled": lambda: compiled.run(token_ids, positions, tables),
             "pieces_eager": run_pieces(ex12.run_piece, batch),
             "pieces_compiled": run_pieces(compiled.run_piece, batch),
             "pieces_eager_1_token": run_pieces(ex12.run_piece, 1),
             "pieces_compiled_1_token": run_pieces(compiled.run_piece, 1),
             "lm_head": lambda: model.lm_head(inputs.final[:batch])}
    timed = replay.time_paths(paths, repeats=repeats, steps=steps, device=model.device)
    ms = {name: t["step_s"] * 1e3 for name, t in timed.items()}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run_pieces(compiled.run_piece, batch)()
    lookups = [e for e in prof.key_averages() if "Cache Lookup" in e.key]
    guard_ms = sum(e.cpu_time_total for e in lookups) / 1e3 / (steps * len(pieces)) if lookups else None
    n = len(pieces)
    return {"batch": batch, "context": context, "pieces": n, "ms": ms,
            "compiled_over_eager": timed["compiled"]["step_s"] and timed["eager"]["step_s"] / timed["compiled"]["step_s"],
            "lm_head_share": ms["lm_head"] / ms["ex5_forward"], "pieces_share": ms["pieces_eager"] / ms["ex5_forward"],
            "compiled_extra_ms": ms["compiled"] - ms["eager"],
            "pieces_extra_ms": ms["pieces_compiled"] - ms["pieces_eager"],
            "call_ms": {"eager": ms["pieces_eager_1_token"] / n, "compiled": ms["pieces_compiled_1_token"] / n},
            "call_extra_ms": (ms["pieces_compiled_1_token"] - ms["pieces_eager_1_token"]) / n,
            "guard_ms_per_call": guard_ms}
