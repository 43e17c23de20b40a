"""The decks' figures (slides/figures/*.png), measured and drawn from the project's own code; the entry
point is scripts/make_figures.py, which only parses its options and calls draw().

Each figure is a function registered with @figure(module, filename); it gets a shared Context (model,
tokenizer, the implementation under WORKSHOP_IMPL, default: the reference solutions) and returns a
matplotlib Figure. To add a module's figures, add a section of such functions below: they measure with
and draw with that course module's own file in workshop/figures/. The timings are measured on the
machine that draws: draw on a quiet machine.

What a figure function measures, it also stores in DATA (timings as medians of several runs, counters
exact); draw() writes DATA to results/figures.json (workshop/results/store.py), from which
`python scripts/update_docs.py` fills the numbers the decks quote. Each figure's drawn size and
smallest font go there too (generation.save), for tests/test_slides.py, and the results files it was
drawn from: a figure function reads results/<name>.json only through drawn_from(name), which records
the file's date and a digest of the data used, so that tests/test_slides.py fails once the file is
re-measured and the figure not redrawn (`python scripts/make_figures.py --only FILE.png` redraws one).
"""

import copy
import fcntl
import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import gpt
from workshop.serving.sampling import SamplingParams
from workshop.grading.harness import implementation
from workshop.serving.workloads import mixed_workload, sample_prompts
from workshop.figures import generation as figures
from workshop.figures import paging as paging_plots
from workshop.figures import sampling as sampling_plots
from workshop import results
from workshop.serving import runs as serving
from workshop.figures import serving as serving_plots

ROOT = Path(__file__).resolve().parents[2]

OUT_DIR = ROOT / "slides" / "figures"
DATA = {}  # what the figures measured, saved to results/figures.json
PROMPT = "First Citizen:\nBefore we proceed any further, hear me"
REGISTRY = {}  # module number -> [(filename, function)]


def figure(module, filename):
    def register(fn):
        REGISTRY.setdefault(module, []).append((filename, fn))
        return fn
    return register


SOURCES = []  # the results files read by the figure being drawn (drawn_from), saved with it in figures.json


def drawn_from(name, part=None):
    """results/<name>.json, for a figure to draw from: every figure function reads results files through
    this, never results.load, so that figures.json records each figure's sources (file, date measured,
    digest of the data used: all of it, or the dotted `part` of "data"); tests/test_slides.py fails when a
    file has been re-measured since the figures drawn from it."""
    record = results.load(name)
    source = results.provenance(name, record, part)
    if source not in SOURCES:
        SOURCES.append(source)
    return record


@dataclass
class Context:
    impl: str
    device: str
    repeats: int = 3  # timed runs per length (the median is plotted)

    @functools.cached_property
    def model(self):
        return gpt.load_model("tiny", device=self.device)

    @functools.cached_property
    def tokenizer(self):
        return gpt.load_tokenizer()

    @functools.cached_property
    def prompt_ids(self):
        return self.tokenizer.encode(PROMPT)

    def module(self, name):
        return implementation(name, self.impl)

    @functools.cached_property
    def generators(self):
        return {"naive": self.module("ex1_generate").generate, "KV cache": self.module("ex2_kv_cache").generate}

    @property
    def cost(self):
        """Naive and KV-cache generate as timed_generate.py measured them (results/timed_generate.json): the
        figures, the README and the decks show one measurement, never two that disagree by noise."""
        data = drawn_from("timed_generate")["data"]
        lengths = sorted(data["lengths"], key=int)
        rows = [data["lengths"][n] for n in lengths]
        return figures.GenerationCost([int(n) for n in lengths],
                                      {"naive": [r["naive_s"] for r in rows], "KV cache": [r["kv_cache_s"] for r in rows]},
                                      {"naive": [r["naive_token_passes"] for r in rows], "KV cache": [r["kv_cache_token_passes"] for r in rows]},
                                      [r["speedup"] for r in rows])

    @property
    def cost_prompt_tokens(self):
        return drawn_from("timed_generate")["data"]["prompt_tokens"]


# ----------------------------------------------------------------------------------------------
# Module 1: naive generate

@figure(1, "01_gpt2_block.png")
def gpt2_block(ctx):
    c = ctx.model.config
    head = c.n_embd * c.vocab_size  # multiply-adds per token in the output layer...
    blocks = c.n_layer * 12 * c.n_embd ** 2  # ...and in the blocks' matmuls (qkv 3, proj 1, mlp 8 x n_embd^2)
    DATA["model"] = {"n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "vocab_size": c.vocab_size,
                     "parameters": ctx.model.num_parameters(), "output_layer_share": head / (head + blocks)}
    return figures.plot_gpt2_block(ctx.model, len(ctx.prompt_ids))


@figure(1, "01_generation_loop.png")
def generation_loop(ctx):
    steps = figures.generation_steps(ctx.model, ctx.generators["naive"], ctx.prompt_ids, 6)
    return figures.plot_generation_loop(ctx.prompt_ids, steps, ctx.tokenizer, ctx.model.config.vocab_size)


@figure(1, "01_next_token.png")
def next_token(ctx):
    ids = torch.tensor([ctx.prompt_ids], device=ctx.model.device)
    token_ids, probs = figures.next_token_distribution(ctx.model, ids)
    return figures.plot_next_token(token_ids, probs, ctx.tokenizer, PROMPT.split("\n")[-1])


@figure(1, "01_positions_per_pass.png")
def naive_positions(ctx):
    prompt = ctx.prompt_ids[:6]
    passes = figures.positions_per_pass(ctx.model, ctx.generators["naive"], prompt, 10)
    return figures.plot_positions_per_pass({"naive": passes}, len(prompt))


@figure(1, "01_naive_cost.png")
def naive_cost(ctx):
    return figures.plot_generation_cost(ctx.cost.only("naive"), ctx.cost_prompt_tokens,
                                        title=f"naive greedy generate, tiny model, {_machine()}")


# ----------------------------------------------------------------------------------------------
# Module 2: KV cache

@figure(2, "02_positions_per_pass.png")
def cached_positions(ctx):
    prompt = ctx.prompt_ids[:6]
    passes = {label: figures.positions_per_pass(ctx.model, fn, prompt, 10) for label, fn in ctx.generators.items()}
    return figures.plot_positions_per_pass(passes, len(prompt))


@figure(2, "02_naive_vs_kv.png")
def naive_vs_kv(ctx):
    return figures.plot_generation_cost(ctx.cost, ctx.cost_prompt_tokens, title=f"naive vs KV cache, tiny model, {_machine()}")


@figure(2, "02_kv_cache_growth.png")
def kv_cache_growth(ctx):
    shapes = figures.kv_cache_lengths(ctx.module("ex2_kv_cache"), ctx.model, ctx.prompt_ids, 6)
    return figures.plot_kv_cache_growth(shapes)


@figure(2, "02_prefill_vs_decode.png")
def prefill_vs_decode(ctx):
    timing = figures.measure_prefill_decode(ctx.module("ex2_kv_cache"), ctx.model, [8, 16, 32, 64, 128, 256],
                                            repeats=2 * ctx.repeats + 1)
    per_token = [p / t for p, t in zip(timing["prefill_s"], timing["lengths"])]
    DATA["prefill_decode"] = {**timing, "decode_over_prefill_per_token": [d / p for d, p in zip(timing["decode_s"], per_token)],
                              "longest": timing["lengths"][-1]}
    return figures.plot_prefill_decode(timing, title=f"one forward pass of the tiny model, {_machine()}")


@figure(2, "02_causal_masks.png")
def causal_masks(ctx):
    DATA["chunked_prefill"] = {"prompt_tokens": len(ctx.prompt_ids), "chunk": 4,
                               **figures.measure_chunked_prefill(ctx.module("ex2_kv_cache"), ctx.model, ctx.prompt_ids, 4)}
    return figures.plot_causal_masks(ctx.module("ex2_kv_cache").causal_mask)


# ----------------------------------------------------------------------------------------------
# Modules 3 and 4: static and continuous batching (measuring: workshop/serving/runs.py, drawing: workshop/figures/serving.py)

TIMELINE_LENGTHS = [3, 8, 2, 5, 4, 5, 3, 2]  # new tokens of the course's eight requests in four slots
BATCH_SIZES = [1, 2, 4, 8, 16]
_SERVING = {}  # per Context: runs shared by several figures


def _serving(ctx, key, measure):
    if (id(ctx), key) not in _SERVING:
        _SERVING[id(ctx), key] = measure()
    return _SERVING[id(ctx), key]


def _timeline_runs(ctx):
    def measure():
        prompts = sample_prompts(ctx.model, len(TIMELINE_LENGTHS), 3, 12, seed=0)
        static = ctx.module("ex3_static_batching").generate(ctx.model, prompts, TIMELINE_LENGTHS, 4, eos_token_id=-1)
        ex4 = ctx.module("ex4_continuous_batching")
        continuous = ex4.generate(ctx.model, [ex4.Request(p, n) for p, n in zip(prompts, TIMELINE_LENGTHS)], 4, eos_token_id=-1)
        tokens = {i: [ctx.tokenizer.decode([t]) for t in out] for i, out in enumerate(continuous.outputs)}
        return static, continuous, tokens
    return _serving(ctx, "timeline", measure)


def _median_run(runs):
    """The run of median duration (an odd number of runs): its throughput and latencies are those of a typical run."""
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def _sweep(ctx):
    def measure():
        workload = mixed_workload(ctx.model, 24, prompt_len=(8, 32), output_len=(4, 48), seed=0)
        ex3, ex4 = ctx.module("ex3_static_batching"), ctx.module("ex4_continuous_batching")
        engines = {"static": lambda b: serving.run_static(ex3, ctx.model, workload, b),
                   "continuous": lambda b: serving.run_continuous(ex4, ctx.model, workload, b)}
        runs = {label: [] for label in engines}
        for b in BATCH_SIZES:
            samples = {label: [] for label in engines}
            for _ in range(ctx.repeats):  # the engines take turns, so load changes hit both alike
                for label, fn in engines.items():
                    samples[label].append(fn(b))
            for label in engines:
                runs[label].append(_median_run(samples[label]))
        print(serving.table(runs))
        DATA["sweep"] = {"requests": len(workload), "repeats": ctx.repeats, "batch_sizes": BATCH_SIZES, **{
            label: {str(r.batch_size): {"tokens_per_s": r.throughput, "occupancy": r.occupancy, "steps": r.steps,
                                        "median_latency_s": statistics.median(r.latency)} for r in series}
            for label, series in runs.items()}}
        DATA["sweep"]["continuous_over_static"] = {str(b): DATA["sweep"]["continuous"][str(b)]["tokens_per_s"] /
                                                   DATA["sweep"]["static"][str(b)]["tokens_per_s"] for b in BATCH_SIZES}
        return runs
    return _serving(ctx, "sweep", measure)


@figure(3, "03_left_padding.png")
def left_padding(ctx):
    texts = ["ROMEO:\nWhat light", "First Citizen:\nBefore we proceed", "JULIET:\nO Romeo!", "KING:"]
    batch = ctx.module("ex3_static_batching").left_pad([ctx.tokenizer.encode(t) for t in texts])
    return serving_plots.plot_left_padding(*batch, ctx.tokenizer)


@figure(3, "03_batch_masks.png")
def batch_masks(ctx):
    texts = ["ROMEO:\nWhat light", "KING:", "JULIET:\nO Romeo, Romeo!"]
    ex2 = ctx.module("ex2_kv_cache")
    input_ids, mask, positions = ctx.module("ex3_static_batching").left_pad([ctx.tokenizer.encode(t) for t in texts])
    masks = serving_plots.attention_masks(ex2, ctx.model, input_ids, mask, positions)
    DATA["padding_rules"] = _padding_rules(ctx)
    return serving_plots.plot_batch_masks(masks, mask)


def _padding_rules(ctx):
    """Each of module 3's rules, broken one at a time: the last logits of a padded prefill against
    each prompt alone (max |difference| over the rows that have pads)."""
    ex2, ex3 = ctx.module("ex2_kv_cache"), ctx.module("ex3_static_batching")
    prompts = sample_prompts(ctx.model, 6, 3, 40, seed=1)
    ids, mask, pos = ex3.left_pad(prompts)

    def last_logits(ids, pos, mask):
        with torch.no_grad():
            return ex2.forward(ctx.model, ids, pos, ex2.KVCache(ctx.model.config.n_layer), mask)[:, -1]

    alone = torch.cat([last_logits(torch.tensor([p]), torch.arange(len(p))[None], None) for p in prompts])
    padded = [r for r, p in enumerate(prompts) if len(p) < ids.shape[1]]
    variants = {"all_rules": (pos, mask), "positions_count_pads": (torch.arange(ids.shape[1]).expand_as(ids), mask),
                "pads_visible": (pos, torch.ones_like(mask))}
    out = {}
    for name, (p, m) in variants.items():
        diff = (last_logits(ids, p, m) - alone).abs().amax(-1)[padded]
        out[name] = {"min": diff.min().item(), "max": diff.max().item()}
    return out


def _batch_vs_one_by_one(ctx):
    """8 requests (16-token prompts, 24 new tokens each) as one batch and one by one: median seconds."""
    ex3 = ctx.module("ex3_static_batching")
    prompts = sample_prompts(ctx.model, 8, 16, 16, seed=2)
    batch, alone = [], []
    for _ in range(2 * ctx.repeats + 1):
        start = time.perf_counter()
        ex3.generate_batch(ctx.model, prompts, [24] * 8, -1)
        batch.append(time.perf_counter() - start)
        start = time.perf_counter()
        for p in prompts:
            ex3.generate_batch(ctx.model, [p], [24], -1)
        alone.append(time.perf_counter() - start)
    b, a = statistics.median(batch), statistics.median(alone)
    return {"requests": 8, "prompt_tokens": 16, "new_tokens": 24, "batch_s": b, "one_by_one_s": a, "speedup": a / b}


@figure(3, "03_static_timeline.png")
def static_timeline(ctx):
    static, _, tokens = _timeline_runs(ctx)
    timeline = serving.static_timeline([len(out) for out in static.outputs], 4)
    return serving_plots.plot_timelines([timeline], ["static batching, 4 slots"], tokens=tokens)


@figure(3, "03_batch_size_sweep.png")
def static_sweep(ctx):
    runs = {"static": _sweep(ctx)["static"]}
    DATA["batch_vs_one_by_one"] = _batch_vs_one_by_one(ctx)
    return serving_plots.plot_batch_size_sweep(runs, title=f"static batching, 24 mixed requests, tiny model, {_machine()}")


@figure(4, "04_timelines.png")
def timelines(ctx):
    static, continuous, tokens = _timeline_runs(ctx)
    return serving_plots.plot_timelines([serving.static_timeline([len(out) for out in static.outputs], 4),
                                           serving.continuous_timeline(continuous)],
                                          ["static batching", "continuous batching"], tokens=tokens)


@figure(4, "04_batch_size_sweep.png")
def continuous_sweep(ctx):
    return serving_plots.plot_batch_size_sweep(_sweep(ctx), title=f"24 mixed requests, tiny model, {_machine()}")


@figure(4, "04_ttft_tpot.png")
def ttft_tpot(ctx):
    ex4, runs = ctx.module("ex4_continuous_batching"), {}
    for rate in (None, 100, 20):
        workload = mixed_workload(ctx.model, 24, prompt_len=(8, 32), output_len=(4, 48), rate=rate, seed=0)
        runs["all at once" if rate is None else f"{rate} requests/s"] = serving.run_continuous(ex4, ctx.model, workload, 8)
    print(serving.table({label: [run] for label, run in runs.items()}))
    DATA["latency_distributions"] = {label: {"median_ttft_s": statistics.median(r.ttft), "median_tpot_s": statistics.median(r.tpot)}
                                     for label, r in runs.items()}
    return serving_plots.plot_latency_distributions(runs)


@figure(4, "04_running_batch.png")
def running_batch(ctx):
    ex4 = ctx.module("ex4_continuous_batching")
    prompts = sample_prompts(ctx.model, len(TIMELINE_LENGTHS), 3, 12, seed=0)
    snapshots = serving_plots.record_running_batch(ex4, ctx.model, [ex4.Request(p, n) for p, n in zip(prompts, TIMELINE_LENGTHS)], 4)
    return serving_plots.plot_running_batch(snapshots, steps=[0, 1, 2, 3, 4, 5])


LOAD_RATES = [5, 10, 20, 40, 80, 160, None]  # requests/s; None: all 24 at t = 0


@figure(4, "04_latency_vs_load.png")
def latency_vs_load(ctx):
    ex4, load = ctx.module("ex4_continuous_batching"), {"rates": LOAD_RATES, "ttft_s": [], "tpot_s": [], "max_batch_size": 8}
    for rate in LOAD_RATES:
        ttft, tpot = [], []
        for seed in range(ctx.repeats):  # a fresh Poisson draw each run: the median over runs of each run's median
            workload = mixed_workload(ctx.model, 24, prompt_len=(8, 32), output_len=(4, 48), rate=rate, seed=seed)
            run = serving.run_continuous(ex4, ctx.model, workload, 8)
            ttft.append(statistics.median(run.ttft))
            tpot.append(statistics.median(run.tpot))
        load["ttft_s"].append(statistics.median(ttft))
        load["tpot_s"].append(statistics.median(tpot))
        print(f"rate {rate}: median TTFT {load['ttft_s'][-1] * 1e3:.1f} ms, TPOT {load['tpot_s'][-1] * 1e3:.1f} ms", flush=True)
    DATA["load"] = load
    return serving_plots.plot_latency_vs_load(load)


# ----------------------------------------------------------------------------------------------
# Module 5: the paged KV cache (measuring and drawing: workshop/figures/paging.py)

WORKED_PROMPT = "Alan Turing is a computer scientist"  # the course's worked example, block size 4
WORKED_WORDS = [" and", " mathematician", " renowned"]  # its completion, appended one at a time
OTHER_PROMPT = "ROMEO:\nBut soft,"  # request B, sharing the pool; its tokens are the model's greedy ones
PAGED_BLOCK_SIZE = 16
STEPS_BUDGET, STEPS_BLOCKS = 64, 40  # tokens per step and pool blocks of the engine-steps figure: chunks and preemptions


def _mixed_32(ctx):
    return _serving(ctx, "mixed_32", lambda: mixed_workload(ctx.model, 32, prompt_len=(8, 64), output_len=(8, 96), seed=0))


def _block_table_example(ctx):
    def measure():
        other = ctx.tokenizer.encode(OTHER_PROMPT)
        other_tokens = ctx.module("ex2_kv_cache").generate(ctx.model, other, len(WORKED_WORDS), -1)
        example = paging_plots.block_table_example(ctx.module("ex5_paged_kv_cache"), ctx.tokenizer, WORKED_PROMPT, WORKED_WORDS,
                                                   OTHER_PROMPT, other_tokens, block_size=4, num_blocks=8)
        DATA["block_table"] = {
            "prompt": WORKED_PROMPT, "prompt_tokens": len(ctx.tokenizer.encode(WORKED_PROMPT)), "block_size": example["block_size"],
            "num_blocks": example["num_blocks"], "words": example["words"], "tokens_per_word": example["tokens_per_word"],
            "snapshots": [{"label": s["label"], "num_tokens": s["tables"]["A"]["num_tokens"], "blocks": s["tables"]["A"]["blocks"],
                           "slots": s["tables"]["A"]["slots"], "other_blocks": s["tables"]["B"]["blocks"]} for s in example["snapshots"]]}
        return example
    return _serving(ctx, "block_table", measure)


@figure(5, "05_block_table.png")
def block_table(ctx):
    return paging_plots.plot_block_table(_block_table_example(ctx))


@figure(5, "05_block_table_steps.png")
def block_table_steps(ctx):
    return paging_plots.plot_block_table_steps(_block_table_example(ctx))


@figure(5, "05_kv_memory.png")
def kv_memory(ctx):
    configs = {"tiny": ctx.model.config, "gpt2": gpt.GPTConfig(**gpt.RANDOM_SIZES["random-124M"]),
               "gpt2-xl": gpt.GPTConfig(**gpt.RANDOM_SIZES["random-1558M"])}
    DATA["kv_size"] = {name: paging_plots.kv_size(config) for name, config in configs.items()}
    workload = _mixed_32(ctx)
    memory = _serving(ctx, "kv_memory", lambda: paging_plots.kv_memory(
        ctx.module("ex4_continuous_batching"), ctx.module("ex5_paged_kv_cache"), ctx.model, workload, 8, PAGED_BLOCK_SIZE))
    DATA["kv_memory"] = {"requests": len(workload), "batch_size": 8, "block_size": PAGED_BLOCK_SIZE, "steps": memory["steps"],
                         "context": memory["context_slots"], "mean_tokens": statistics.mean(memory["paged"].tokens),
                         **{key: {"utilization": memory[key].utilization, "mean_slots": statistics.mean(memory[key].slots),
                                  "peak_slots": memory[key].peak_slots} for key in ("context", "reservation", "batch", "paged")}}
    DATA["kv_memory"]["paged_over_batch_peak"] = memory["batch"].peak_slots / memory["paged"].peak_slots
    return paging_plots.plot_kv_memory(memory)


@figure(5, "05_engine_steps.png")
def engine_steps(ctx):
    workload, paged = _mixed_32(ctx), ctx.module("ex5_paged_kv_cache")
    steps = paging_plots.engine_steps(paged, ctx.model, workload, 8, num_blocks=STEPS_BLOCKS, block_size=PAGED_BLOCK_SIZE,
                                      max_num_batched_tokens=STEPS_BUDGET)
    roomy = serving.run_paged(paged, ctx.model, workload, 8, block_size=PAGED_BLOCK_SIZE)  # a whole context each, 512 tokens a step
    result = steps["result"]
    DATA["engine_steps"] = {
        "requests": len(workload), "batch_size": 8, "block_size": PAGED_BLOCK_SIZE, "budget": STEPS_BUDGET, "num_blocks": STEPS_BLOCKS,
        "steps": result.stats.steps, "roomy_steps": roomy.steps, "preemptions": result.stats.preemptions,
        "preempted_requests": sum(seq.preemptions > 0 for seq in result.sequences),
        "prefill_tokens": sum(steps["prefill"]), "decode_tokens": sum(steps["decode"]), "recomputed_tokens": sum(steps["recompute"]),
        "peak_blocks": result.stats.peak_blocks, "outputs_identical": sum(a == b for a, b in zip(result.outputs, roomy.outputs)),
        "max_tokens_per_step": max(result.stats.scheduled_tokens),
        "chunked_prompts": sum(n > 1 for n in steps["prompt_steps"].values()), "most_chunks": max(steps["prompt_steps"].values())}
    return paging_plots.plot_engine_steps(steps, STEPS_BLOCKS, STEPS_BUDGET)


@figure(5, "05_gather.png")
def gather(ctx):
    example = paging_plots.gather_example(ctx.module("ex5_paged_kv_cache"))
    DATA["gather"] = {"block_size": example["block_size"], "tables": example["tables"], "padded_tables": example["padded_tables"]}
    return paging_plots.plot_gather(example)


@figure(5, "05_sharing.png")
def sharing(ctx):
    paged = ctx.module("ex5_paged_kv_cache")
    prompt = ctx.tokenizer.encode(WORKED_PROMPT)
    requests = [paged.Request(prompt, 4, n=2, sampling=SamplingParams(seed=0)),
                paged.Request(prompt + ctx.tokenizer.encode(WORKED_WORDS[0]), 2, arrival_step=2)]
    snapshots, _ = paging_plots.sharing_example(paged, ctx.model, requests, block_size=4, num_blocks=8, steps=3)
    DATA["sharing"] = {"block_size": 4, "num_blocks": 8, "snapshots": snapshots}
    DATA["parallel_sampling"] = _parallel_sampling(ctx, paged)
    DATA["prefix_caching"] = _prefix_caching(ctx, paged)
    first = snapshots[0]["tables"]["R0.0"]
    titles = [f"after T{snapshots[0]['step'] + 1}: R0's prompt is computed;\nits 2 continuations share blocks {first[0]} and {first[1]}",
              f"after T{snapshots[1]['step'] + 1}: R0.0 wrote into shared\nblock {first[1]}: a copy first (copy-on-write)",
              f"after T{snapshots[2]['step'] + 1}: R1 arrives and finds\nblock {snapshots[2]['tables']['R1'][0]} in the prefix cache"]
    return paging_plots.plot_sharing(snapshots, titles, 4, 8)


def _parallel_sampling(ctx, paged):
    """n = 4 continuations of one prompt, sampled: as one request (forks share the prompt's blocks) and as
    4 requests with the same seeds (each computes and stores its own prompt)."""
    prompt = sample_prompts(ctx.model, 1, 40, 40, seed=3)[0]
    forked = paged.generate(ctx.model, [paged.Request(prompt, 32, n=4, sampling=SamplingParams(seed=0))], 4, eos_token_id=-1,
                            block_size=PAGED_BLOCK_SIZE)
    apart = paged.generate(ctx.model, [paged.Request(prompt, 32, sampling=SamplingParams(seed=i)) for i in range(4)], 4, eos_token_id=-1,
                           block_size=PAGED_BLOCK_SIZE)
    return {"n": 4, "prompt_tokens": len(prompt), "new_tokens": 32, "block_size": PAGED_BLOCK_SIZE,
            "forked": {"peak_blocks": forked.stats.peak_blocks, "computed_tokens": forked.stats.computed_tokens,
                       "copies": forked.stats.copies},
            "apart": {"peak_blocks": apart.stats.peak_blocks, "computed_tokens": apart.stats.computed_tokens},
            "outputs_identical": sum(a == b for a, b in zip(forked.outputs, apart.outputs))}


def _prefix_caching(ctx, paged):
    """16 requests that share a 48-token prefix (a system prompt) before their own 4-16 tokens, with and
    without prefix caching: the prompt tokens computed, and the outputs."""
    prefix = sample_prompts(ctx.model, 1, 48, 48, seed=4)[0]
    prompts = [prefix + own for own in sample_prompts(ctx.model, 16, 4, 16, seed=5)]
    runs = {on: paged.generate(ctx.model, [paged.Request(p, 16) for p in prompts], 8, eos_token_id=-1, block_size=PAGED_BLOCK_SIZE,
                               enable_prefix_caching=on) for on in (False, True)}
    prompt_tokens = sum(map(len, prompts))
    return {"requests": len(prompts), "prefix_tokens": len(prefix), "prompt_tokens": prompt_tokens, "new_tokens": 16,
            "block_size": PAGED_BLOCK_SIZE, "hit_tokens": runs[True].stats.prefix_hit_tokens,
            "hit_share": runs[True].stats.prefix_hit_tokens / prompt_tokens,
            "computed_tokens": {"off": runs[False].stats.computed_tokens, "on": runs[True].stats.computed_tokens},
            "outputs_identical": sum(a == b for a, b in zip(runs[False].outputs, runs[True].outputs))}


# ----------------------------------------------------------------------------------------------
# Module 6: decoding strategies (measuring and drawing: workshop/figures/sampling.py)

SAMPLED = SamplingParams(temperature=0.8, top_p=0.9)  # the engine's sampled requests
JSON_REGEX = r'\{"name": "(Romeo|Juliet|Hamlet|Lear|Richard|Henry)", "age": [1-9][0-9]?\}'


def _sampling(ctx):
    """DATA["sampling"]: the figures of module 6 fill it, each its own keys, so that redrawing some of them
    (--only) keeps what the others measured (the engine's timings above all: measure those on a quiet machine)."""
    return _serving(ctx, "sampling", lambda: DATA.setdefault("sampling", {}))


@figure(6, "06_processors.png")
def processors(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    logits = {name: sampling_plots.next_token_logits(ctx.model, ctx.tokenizer.encode(prompt))
              for name, prompt in (("course", sampling_plots.COURSE_PROMPT), ("peaked", sampling_plots.PEAKED_PROMPT))}
    views = sampling_plots.processor_views(dec, logits["peaked"])
    data["vocab_size"] = ctx.model.config.vocab_size
    data["keep"] = {name: {"top_prob": float(row.softmax(-1).max()), **sampling_plots.keep_counts(dec, row)} for name, row in logits.items()}
    data["panels"] = [{"label": v["label"], "kept": v["kept"]} for v in views]
    row = logits["peaked"][None]  # the order matters: temperature 1.5 before top-p 0.9, or after
    data["order"] = {"temperature": 1.5, "top_p": 0.9,
                     "temperature_first": sampling_plots.kept(dec.apply_top_p(dec.apply_temperature(row, [1.5]), [0.9])[0]),
                     "top_p_first": sampling_plots.kept(dec.apply_temperature(dec.apply_top_p(row, [0.9]), [1.5])[0])}
    return sampling_plots.plot_processors(views, ctx.tokenizer)


@figure(6, "06_temperatures.png")
def temperatures(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    prompt = ctx.tokenizer.encode(sampling_plots.COURSE_PROMPT)
    texts = sampling_plots.sample_texts(dec, ctx.model, ctx.tokenizer, prompt, [0.01, 0.7, 1.5], [0, 1, 2], 16)
    greedy = dec.generate(ctx.model, ctx.tokenizer, prompt, 16, dec.GREEDY, stop_token_ids=()).text
    data["temperatures"] = {"near_zero": 0.01, "seeds": 3, "new_tokens": 16, "near_zero_equal_greedy": sum(t == greedy for t in texts[0.01]),
                            "distinct_texts": {str(t): len(set(v)) for t, v in texts.items()}}
    rows = []
    for t, samples in texts.items():
        if len(set(samples)) == 1:  # T -> 0: every seed gives the greedy text
            rows.append({"label": f"T = {t}, seeds 0-{len(samples) - 1}: all alike", "text": samples[0]})
        else:
            rows += [{"label": f"T = {t}, seed {s}", "text": text} for s, text in enumerate(samples)]
    data["temperatures"]["rows"] = [{"label": r["label"], "text": _cell(r["text"])} for r in rows]  # the deck's Markdown table
    return sampling_plots.plot_texts(rows, title=f"{sampling_plots.COURSE_PROMPT} ...")


def _cell(text):
    """A generated text as a Markdown table cell shows it: newlines as ↵, no bar to break the table."""
    return text.replace("\n", "↵").replace("|", "\\|").strip() or "∅"


@figure(6, "06_greedy_repeats.png")
def greedy_repeats(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    rows = sampling_plots.repetition(dec, ctx.model, ctx.tokenizer, ctx.tokenizer.encode("ROMEO:\n"), 40)
    data["repetition"] = {"new_tokens": 40, "penalty": 1.3, **{key: row["distinct_3grams"] for key, row in
                                                               zip(("greedy", "greedy_penalty", "sampled"), rows)}}
    data["repetition"]["rows"] = [{"label": row["label"], "text": _cell(row["text"])} for row in rows]  # the deck's Markdown table
    for row in rows:
        row["label"] += f": {row['distinct_3grams']:.0%} distinct"
    return sampling_plots.plot_texts(rows, title="ROMEO:↵ ...   (distinct: the share of the token 3-grams that occur once)")


@figure(6, "06_beam_vs_greedy.png")
def beam_vs_greedy(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    rows = sampling_plots.beam_vs_greedy(dec, ctx.model, ctx.tokenizer, ctx.tokenizer.encode(sampling_plots.COURSE_PROMPT), 20)
    data["beam"] = {"new_tokens": 20, "temperature": 0.8, **{row["key"]: row["logprob"] for row in rows}}
    data["beam"]["sampled_mean"] = statistics.mean(row["logprob"] for row in rows if row["key"].startswith("sampled"))
    return sampling_plots.plot_texts(rows, value="logprob", value_label="total log-probability of the 20 new tokens (nearer 0: more likely)",
                                     title=f"{sampling_plots.COURSE_PROMPT} ...")


@figure(6, "06_beam_search.png")
def beam_search(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    prompt = ctx.tokenizer.encode(sampling_plots.PEAKED_PROMPT)
    num_beams, steps = 2, 4
    trace = sampling_plots.beam_trace(ctx.model, prompt, num_beams, steps)
    best = sampling_plots.beam_path(trace)
    found = dec.beam_search(ctx.model, prompt, num_beams, steps)[0].tokens  # exercise 6's own search: the same best
    data["beam_search"] = {"prompt": sampling_plots.PEAKED_PROMPT, "num_beams": num_beams, "steps": steps,
                           "parents": [entry["parents"] for entry in trace], "best_total": trace[-1]["candidates"][0]["total"],
                           "best_text": ctx.tokenizer.decode(best), "same_as_beam_search": found == best}
    return sampling_plots.plot_beam_search(trace, ctx.tokenizer, sampling_plots.PEAKED_PROMPT, num_beams)


@figure(6, "06_streaming.png")
def streaming(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    tokens = dec.generate(ctx.model, ctx.tokenizer, ctx.tokenizer.encode("ROMEO:\n"), 40, dec.GREEDY, stop_token_ids=()).token_ids
    steps, checker = sampling_plots.stream_steps(dec, ctx.tokenizer, tokens, ["I'll be"])
    data["streaming"] = {"stop": "I'll be", "tokens": len(steps), "held_steps": sum(bool(s["held"]) for s in steps),
                         "text": checker.text, "finish_reason": checker.finish_reason}
    first = max(0, len(steps) - 8)  # the deck's Markdown table: the last 8 steps, as shown (↵ newline, ␣ space)
    data["streaming"]["rows"] = [{"step": i, "token": sampling_plots.show(s["token"]),
                                  "streamed": sampling_plots.show(s["piece"]) if s["piece"] else "-",
                                  "held": "stop string: cut" if s["finished"] else sampling_plots.show(s["held"]) if s["held"] else ""}
                                 for i, s in enumerate(steps) if i >= first]
    return sampling_plots.plot_streaming(steps, "I'll be", checker.text)


@figure(6, "06_chi_square.png")
def chi_square(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    logits = sampling_plots.next_token_logits(ctx.model, ctx.tokenizer.encode(sampling_plots.PEAKED_PROMPT))
    probs = dec.filter_logits(logits[None], [SamplingParams(temperature=0.7, top_k=8)])[0].softmax(-1)
    ids = probs.topk(8).indices.tolist()  # the 8 tokens top-k keeps: draw from them alone (a small distribution)
    small = probs[ids] / probs[ids].sum()
    counts = sampling_plots.draw_counts(dec, small, 20_000, seed=0)
    data["chi_square"] = {"draws": 20_000, "temperature": 0.7, "top_k": 8, "tokens": [ctx.tokenizer.decode([i]) for i in ids],
                          "same_seed_same_tokens": sampling_plots.same_seed_same_tokens(dec, small)}
    for name, c in counts.items():
        stat, dof, p = sampling_plots.chi_square(c, small)
        data["chi_square"][name] = {"statistic": stat, "dof": dof, "p_value": p}
    return sampling_plots.plot_chi_square([repr(ctx.tokenizer.decode([i])) for i in ids], small.tolist(), counts)


@figure(6, "06_constrained.png")
def constrained(ctx):
    import re

    con, data = ctx.module("ex6_constrained"), _sampling(ctx)
    vocab = con.Vocabulary.from_tokenizer(ctx.tokenizer)
    constraint = con.RegexConstraint(JSON_REGEX, vocab)
    run = sampling_plots.constrained_run(con, ctx.model, ctx.tokenizer, ctx.tokenizer.encode("JULIET:\n"), constraint, 48)
    choice = con.ChoiceConstraint([" nightingale", " lark"], vocab)
    lark = con.generate(ctx.model, ctx.tokenizer.encode("JULIET:\nIt was the"), choice, 8)
    data["constrained"] = {"regex": JSON_REGEX, "prompt": "JULIET:\n", "text": run["text"], "tokens": len(run["tokens"]),
                           "matches": bool(re.fullmatch(JSON_REGEX, run["text"])), "first_s": run["first_s"], "cached_s": run["cached_s"],
                           "fewest_allowed": min(s["allowed"] for s in run["steps"]), "most_allowed": max(s["allowed"] for s in run["steps"]),
                           "choice_text": vocab.decode(lark), "choice_tokens": len(lark)}
    return sampling_plots.plot_constrained(run, JSON_REGEX, ctx.model.config.vocab_size)


@figure(6, "06_sampler_cost.png")
def sampler_cost(ctx):
    dec, data = ctx.module("ex6_decoding"), _sampling(ctx)
    logits = sampling_plots.next_token_logits(ctx.model, ctx.tokenizer.encode(sampling_plots.COURSE_PROMPT))
    settings = [("greedy: argmax", dec.GREEDY), ("T 0.8", dec.SamplingParams(temperature=0.8)),
                ("T 0.8, top-k 50", dec.SamplingParams(temperature=0.8, top_k=50)),
                ("T 0.8, top-p 0.9", dec.SamplingParams(temperature=0.8, top_p=0.9))]
    per_row = sampling_plots.sampler_cost(dec, ctx.module("ex2_kv_cache"), ctx.model, logits, settings, repeats=8 * ctx.repeats + 1)
    workload = mixed_workload(ctx.model, 16, prompt_len=(8, 32), output_len=(16, 48), seed=0)
    engine = sampling_plots.engine_cost(ctx.module("ex5_paged_kv_cache"), ctx.model, workload, 8, SAMPLED, rounds=2 * ctx.repeats - 1)
    print(f"engine: greedy {statistics.median(engine['greedy']):.0f} tokens/s, sampled {statistics.median(engine['sampled']):.0f} "
          f"tokens/s, ratios {[round(r, 2) for r in engine['ratios']]}", flush=True)
    data["sampler_ms"] = dict(zip(("greedy", "temperature", "top_k", "top_p", "decode_step"), per_row.values()))
    data["engine"] = {"requests": len(workload), "max_batch_size": 8, "temperature": SAMPLED.temperature, "top_p": SAMPLED.top_p,
                      "rounds": len(engine["ratios"]), "tokens": engine["tokens"],
                      "greedy_tokens_per_s": statistics.median(engine["greedy"]), "sampled_tokens_per_s": statistics.median(engine["sampled"]),
                      "ratios": engine["ratios"], "greedy_over_sampled": engine["ratio"]}
    return sampling_plots.plot_sampler_cost(per_row, engine)


# ----------------------------------------------------------------------------------------------
# Module 0: the BPE tokenizer (measuring and drawing: workshop/figures/bpe.py)

BPE_SENTENCE = "We'll detokenize 31415 naïve  GPT-2 sonnets!"  # a contraction, long words, a number, bytes of ï, two spaces
BPE_WORD = "Ġunbelievably"  # " unbelievably" in GPT-2's byte alphabet: 12 merges to one token


@figure(0, "00_worked_example.png")
def bpe_worked_example(ctx):
    from workshop.figures import bpe as bpe_plots

    example = bpe_plots.worked_example(ctx.module("ex0_bpe"))
    DATA["bpe_worked_example"] = {"merges": [{"pair": " ".join(p), "count": c} for p, c in example["merges"]],
                                  "vocabulary_size": len(example["vocabulary"]),
                                  **bpe_plots.worked_example_record(example)}  # deck 0 shows it as a Markdown table
    return bpe_plots.plot_worked_example(example)


@figure(0, "00_pipeline.png")
def bpe_pipeline(ctx):
    from workshop.figures import bpe as bpe_plots

    rows = bpe_plots.pipeline(ctx.module("ex0_bpe"), BPE_SENTENCE)
    DATA["bpe_pipeline"] = {"text": BPE_SENTENCE, "pieces": len(rows), "tokens": sum(len(r["tokens"]) for r in rows),
                            "bytes": len(BPE_SENTENCE.encode("utf-8"))}
    return bpe_plots.plot_pipeline(rows)


@figure(0, "00_merge_steps.png")
def bpe_merge_steps(ctx):
    from workshop.figures import bpe as bpe_plots

    steps = bpe_plots.merge_steps(ctx.module("ex0_bpe"), BPE_WORD)
    DATA["bpe_merge_steps"] = {"word": BPE_WORD, "merges": len(steps) - 1, "last_rank": steps[-2][2]}
    return bpe_plots.plot_merge_steps(steps)


@figure(0, "00_compression.png")
def bpe_compression(ctx):
    from workshop.figures import bpe as bpe_plots
    from workshop.serving.workloads import HELDOUT_TEXT

    text = HELDOUT_TEXT.read_text()
    data = bpe_plots.compression(ctx.module("ex0_bpe"), text[:20_000], text[60_000:80_000])
    DATA["bpe_compression"] = {**data, "bytes_per_token": {str(k): v for k, v in data["bytes_per_token"].items()}}
    return bpe_plots.plot_compression(data)


@figure(0, "00_throughput.png")
def bpe_throughput(ctx):
    """Drawn from results/tokenizer.json (bench/tokenizer.py), the numbers the deck and the README quote."""
    from workshop.figures import bpe as bpe_plots

    return bpe_plots.plot_throughput(drawn_from("tokenizer"))


# ----------------------------------------------------------------------------------------------
# Module 7: speculative decoding (measuring and drawing: workshop/figures/speculative.py; timings: bench/speculative.py)

SPEC_P = [0.40, 0.25, 0.15, 0.10, 0.06, 0.04, 0.0, 0.0]  # the target's distribution of the rejection-sampling figure
SPEC_Q = [0.10, 0.10, 0.20, 0.20, 0.05, 0.05, 0.15, 0.15]  # the draft's


@figure(7, "07_rounds.png")
def spec_rounds(ctx):
    """One greedy run of exercise 7 with tiny / tiny-draft, round by round."""
    from workshop.figures import speculative as speculative_plots

    k, prompt = 4, ctx.tokenizer.encode(PROMPT)
    rounds = speculative_plots.traced_rounds(ctx.module("ex7_speculative"), ctx.model, gpt.load_model("tiny-draft", device=ctx.device),
                                             prompt, 40, k)
    DATA["speculative_rounds"] = {"k": k, "rounds": len(rounds), "tokens": sum(len(r["emitted"]) for r in rounds),
                                  "accepted": sum(len(r["emitted"]) - 1 for r in rounds)}
    return speculative_plots.plot_rounds(rounds, ctx.tokenizer, PROMPT[-28:], k)


@figure(7, "07_rejection_sampling.png")
def spec_rejection_sampling(ctx):
    from workshop.figures import speculative as speculative_plots

    p, q = torch.tensor(SPEC_P), torch.tensor(SPEC_Q)
    emitted, accepted = speculative_plots.rejection_sampling_draws(ctx.module("ex7_speculative").accept_sampled, p, q)
    DATA["speculative_rejection_sampling"] = {"p": SPEC_P, "q": SPEC_Q, "emitted": emitted.tolist(), "accepted_share": accepted,
                                              "overlap": float(torch.minimum(p, q).sum())}
    return speculative_plots.plot_rejection_sampling(p, q, emitted, accepted)


@figure(7, "07_speedup.png")
def spec_speedup(ctx):
    """Drawn from results/speculative.json (bench/speculative.py), the numbers the deck and the README quote."""
    from workshop.figures import speculative as speculative_plots

    return speculative_plots.plot_speedup(drawn_from("speculative"))


# ----------------------------------------------------------------------------------------------
# Module 8: int8 weight-only quantization (measuring: workshop/quantization.py, drawing: workshop/figures/quantization.py)

QUANT_LAYER = (0, "mlp.c_fc")  # the real weight the granularity and outlier figures quantize


def _quant_weight(ctx):
    layer, name = QUANT_LAYER
    return ctx.model.transformer.h[layer].get_submodule(name).weight.detach(), f"h.{layer}.{name}"


@figure(8, "08_number_formats.png")
def number_formats(ctx):
    from workshop.figures import quantization as quantization_plots

    ex8 = ctx.module("ex8_quantization")
    DATA["number_formats"] = [{"x": x, **{name: {"value": v, "hex": h} for name, (v, h) in row.items()}}
                              for x, row in quantization_plots.course_table(ex8).items()]  # the course's table, in its order
    return quantization_plots.plot_bit_layouts(quantization_plots.bit_rows(ex8))


@figure(8, "08_rounding.png")
def bfloat16_rounding(ctx):
    from workshop.figures import quantization as quantization_plots

    weights = torch.cat([p.detach().flatten() for p in ctx.model.transformer.h.parameters()])
    weights = weights[weights != 0]
    errors = quantization_plots.rounding_errors(ctx.module("ex8_quantization"), weights)
    DATA["bfloat16_rounding"] = {"values": weights.numel(), **{mode: {"mean": e.mean().item(), "max_abs": e.abs().max().item()}
                                                               for mode, e in errors.items()}}
    return quantization_plots.plot_rounding_errors(errors, f"the {weights.numel():,} weights of tiny's blocks")


@figure(8, "08_granularity.png")
def granularity(ctx):
    from workshop.figures import quantization as quantization_plots

    w, where = _quant_weight(ctx)
    errors = quantization_plots.granularity_errors(ctx.module("ex8_quantization"), w)
    DATA["granularity"] = {"layer": where, "shape": list(w.shape), **{label: {"mean_error_over_std": e["error"].mean().item() / w.std().item(),
                                                                             "zero_share": e["zeros"]} for label, e in errors.items()}}
    return quantization_plots.plot_granularity(errors, w.std().item(), f"{where}.weight {tuple(w.shape)}")


@figure(8, "08_outlier.png")
def outlier(ctx):
    """The error histograms are measured here; the perplexities come from results/quantization.json (bench/quantization.py)."""
    from workshop import quantization
    from workshop.figures import quantization as quantization_plots

    measured = drawn_from("quantization", "outlier")["data"]["outlier"]
    spiked, (row, col) = quantization.with_outlier(ctx.model, *QUANT_LAYER, factor=measured["factor"])
    assert (row, col) == (measured["row"], measured["col"]), "the outlier differs from the one bench/quantization.py measured"
    w = spiked.transformer.h[QUANT_LAYER[0]].get_submodule(QUANT_LAYER[1]).weight.detach()
    others = torch.ones(w.shape[0], dtype=torch.bool)
    others[row] = False
    errors = quantization_plots.granularity_errors(ctx.module("ex8_quantization"), w, rows=others)
    clean_std = _quant_weight(ctx)[0].std().item()
    DATA["outlier_errors"] = {label: {"mean_error_over_std": e["error"].mean().item() / clean_std, "zero_share": e["zeros"]}
                              for label, e in errors.items()}
    return quantization_plots.plot_outlier(errors, clean_std, f"h.{QUANT_LAYER[0]}.{QUANT_LAYER[1]}", measured)


@figure(8, "08_asymmetric.png")
def asymmetric(ctx):
    from workshop import quantization
    from workshop.figures import quantization as quantization_plots

    ids = quantization.heldout_ids(ctx.tokenizer)[:128]
    x = quantization_plots.gelu_activations(ctx.model, ids)
    result = quantization_plots.asymmetric_vs_symmetric(ctx.module("ex8_quantization"), x)
    DATA["asymmetric"] = {"values": x.numel(), "min": x.min().item(), "max": x.max().item(),
                          **{name: {"mean_error": r["error"].mean().item(), "levels_used": r["levels_used"]} for name, r in result.items()},
                          "zero_point": result["asymmetric"]["zero_point"]}
    DATA["asymmetric"]["symmetric_over_asymmetric"] = DATA["asymmetric"]["symmetric"]["mean_error"] / DATA["asymmetric"]["asymmetric"]["mean_error"]
    return quantization_plots.plot_asymmetric(x, result)


@figure(8, "08_memory_quality.png")
def memory_quality(ctx):
    """Drawn from results/quantization.json (bench/quantization.py), the numbers the deck and the README quote."""
    from workshop.figures import quantization as quantization_plots

    return quantization_plots.plot_memory_and_quality(drawn_from("quantization")["data"])


# ----------------------------------------------------------------------------------------------
# Module 9: tensor parallelism (measuring and drawing: workshop/figures/parallel.py; timings: bench/tensor_parallel.py)

def _tp_configs(ctx):
    return {"tiny, fp32": (ctx.model.config, 4), "GPT-2 124M, fp16": (gpt.GPTConfig(**gpt.RANDOM_SIZES["random-124M"]), 2),
            "GPT-2 XL, fp16": (gpt.GPTConfig(**gpt.RANDOM_SIZES["random-1558M"]), 2)}


@figure(9, "09_sharding.png")
def tp_sharding(ctx):
    """Block 0 over 2 ranks, read off the shards of exercise 9 (built in this process: sharding communicates nothing)."""
    from workshop.figures import parallel as parallel_plots

    tp, world_size = ctx.module("ex9_tensor_parallel"), 2
    shards = [tp.ParallelGPT(ctx.model, rank, world_size) for rank in range(world_size)]
    found = parallel_plots.owners(ctx.model.transformer.h[0], [shard.h[0] for shard in shards])

    def held(module):
        return sum(t.numel() for t in [*module.parameters(), *module.buffers()])
    blocks = sum(held(b.attn) + held(b.mlp) for b in ctx.model.transformer.h)
    DATA["tensor_parallel_shards"] = {
        "world_size": world_size, "block_numbers": blocks, "held": [held(shard) for shard in shards],
        "block_numbers_held": [sum(held(b.attn) + held(b.mlp) for b in shard.h) for shard in shards],
        "matrices": {key: {"shape": list(info["shape"]), "split": info["split"], "rank_shapes": [list(r) for r in info["rank_shapes"]]}
                     for key, info in found.items()}}
    return parallel_plots.plot_sharding(found, ctx.model.config, world_size)


@figure(9, "09_communication.png")
def tp_communication(ctx):
    from workshop.figures import parallel as parallel_plots

    configs = _tp_configs(ctx)
    DATA["tensor_parallel_communication"] = {
        name: {"payload_bytes_per_token": parallel_plots.communication_per_token(config, 1, nbytes)["payload_bytes"],
               "block_weight_bytes": config.n_layer * 12 * config.n_embd ** 2 * nbytes,
               **{f"sent_per_rank_bytes_w{w}": parallel_plots.communication_per_token(config, w, nbytes)["sent_per_rank_bytes"]
                  for w in (2, 4, 8)}}
        for name, (config, nbytes) in configs.items()}
    return parallel_plots.plot_communication(configs)


@figure(9, "09_time_per_token.png")
def tp_time_per_token(ctx):
    """Drawn from results/tensor_parallel.json (bench/tensor_parallel.py), the numbers the deck and the README quote."""
    from workshop.figures import parallel as parallel_plots

    return parallel_plots.plot_time_per_token(drawn_from("tensor_parallel"))


# ----------------------------------------------------------------------------------------------
# Module 10: attention kernels

@figure(10, "10_memory_hierarchy.png")
def attention_hierarchy(ctx):
    from workshop.figures import attention as attention_plots

    return attention_plots.plot_memory_hierarchy()


@figure(10, "10_online_softmax.png")
def attention_online_softmax(ctx):
    """Exercise 10a's running max and sum over one row of scores, read in chunks."""
    from workshop.figures import attention as attention_plots

    row = torch.tensor([0.5, 1.0, -0.3, 0.8, 2.5, 1.7, 0.2, 2.1, 1.1, 0.4, 3.2, 0.9, -1.0, 0.6, 1.8, 0.1])
    maxes, sums = attention_plots.running_stats(ctx.module("ex10_attention"), row, 4)
    DATA["attention_online_softmax"] = {"row": row.tolist(), "chunk": 4, "running_max": maxes, "running_sum": sums}
    return attention_plots.plot_online_softmax(ctx.module("ex10_attention"), row, 4)


@figure(10, "10_tiles.png")
def attention_tiles(ctx):
    """The tiles exercise 10b's flash_attention loaded: a prefill and a chunk after cached tokens."""
    from workshop.figures import attention as attention_plots

    ex10 = ctx.module("ex10_attention")
    traces = [attention_plots.trace_tiles(ex10, 32, 32, 8, 8), attention_plots.trace_tiles(ex10, 12, 40, 4, 8)]
    DATA["attention_tiles"] = [{key: t[key] for key in ("Tq", "Tk", "block_q", "block_k", "max_error", "bytes")} |
                               {"tiles_loaded": sum(len(v) for v in t["loaded"].values()),
                                "tiles": -(-t["Tq"] // t["block_q"]) * -(-t["Tk"] // t["block_k"])} for t in traces]
    return attention_plots.plot_tiles(traces, ["prefill: 32 queries, 32 keys, tiles 8 x 8",
                                               "a chunk of 12 after 28 cached, tiles 4 x 8"])


@figure(10, "10_bytes_and_time.png")
def attention_bytes_and_time(ctx):
    """Drawn from results/attention.json (bench/attention.py)."""
    from workshop.figures import attention as attention_plots

    return attention_plots.plot_bytes_and_time(drawn_from("attention"))


@figure(10, "10_split_kv.png")
def attention_split_kv(ctx):
    """Exercise 10c's merge over a scattered block table: each chunk's weight, exp(lse_c - lse)."""
    from workshop.figures import attention as attention_plots

    example = attention_plots.split_kv_example(ctx.module("ex10_attention"))
    DATA["attention_split_kv"] = example
    return attention_plots.plot_split_kv(example)


# ----------------------------------------------------------------------------------------------
# Module 11: static shapes and CUDA graphs

@figure(11, "11_kernels.png")
def graphs_kernels(ctx):
    """Drawn from results/cuda_graphs.json (bench/cuda_graphs.py): one decode step's ATen ops by kind."""
    from workshop.figures import graphs as graphs_plots

    record = drawn_from("cuda_graphs", "kernels")
    return graphs_plots.plot_kernels(record["data"]["kernels"], record["data"]["model"])


@figure(11, "11_padding.png")
def graphs_padding(ctx):
    """Drawn from results/cuda_graphs.json: padding against the number of capture sizes."""
    from workshop.figures import graphs as graphs_plots

    return graphs_plots.plot_padding(drawn_from("cuda_graphs", "padding")["data"]["padding"])


@figure(11, "11_step_times.png")
def graphs_step_times(ctx):
    """Drawn from results/cuda_graphs.json: a decode step per path and batch, and the engine's tokens/s."""
    from workshop.figures import graphs as graphs_plots

    return graphs_plots.plot_step_times(drawn_from("cuda_graphs"))


# ----------------------------------------------------------------------------------------------
# Module 12: piecewise graphs and fusion

@figure(12, "12_kernels.png")
def piecewise_kernels(ctx):
    """Drawn from results/piecewise_graphs.json (bench/piecewise_graphs.py): a mixed step's kernels, eager and compiled."""
    from workshop.figures import piecewise as piecewise_plots

    return piecewise_plots.plot_kernels(drawn_from("piecewise_graphs", "kernels")["data"]["kernels"])


@figure(12, "12_step_costs.png")
def piecewise_step_costs(ctx):
    """Drawn from results/piecewise_graphs.json: a decode step's time by part, eager and compiled, and the engine."""
    from workshop.figures import piecewise as piecewise_plots

    return piecewise_plots.plot_step_costs(drawn_from("piecewise_graphs"))


def _machine():
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    return f"CPU, {threads} thread{'s' if threads > 1 else ''}"


# ----------------------------------------------------------------------------------------------
# Drawing: the entry point (scripts/make_figures.py) picks the figures and calls draw()

def selected(modules=None, only=None):
    """[(module, filename, function)] of the registered figures, in module order: only those of `modules`
    and named in `only` where given. A name in `only` that no figure has raises ValueError."""
    unknown = set(only or []) - {name for names in REGISTRY.values() for name, _ in names}
    if unknown:
        raise ValueError(f"no figure named {', '.join(sorted(unknown))}: see --list")
    return [(m, name, fn) for m in sorted(REGISTRY) if not modules or m in modules for name, fn in REGISTRY[m]
            if not only or name in only]


def draw(figures_to_draw, out=OUT_DIR, impl="solutions", device="cpu", threads=1, repeats=3):
    """Draw `figures_to_draw` (from selected()) into `out`; into slides/figures/ (the default), also save
    what they measured, with each figure's size, smallest font and sources, into results/figures.json."""
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(impl=impl, device=device, repeats=repeats)
    try:  # a figure may reuse what another module measured last time
        DATA.update(results.load("figures")["data"])
    except FileNotFoundError:
        pass
    before = copy.deepcopy(DATA)
    DATA["figures"] = {}  # only the figures drawn in this run are saved over the stored ones
    for m, name, fn in figures_to_draw:
        start = time.perf_counter()
        SOURCES.clear()
        drawn = figures.save(fn(ctx), out / name)
        DATA.setdefault("figures", {})[name] = {**drawn, "drawn_from": list(SOURCES)}  # [] : measured in this run
        print(f"module {m}: wrote {(out / name).relative_to(ROOT) if out.is_relative_to(ROOT) else out / name}"
              f" ({time.perf_counter() - start:.1f} s)", flush=True)

    if out == OUT_DIR:  # the committed figures and their numbers, together
        print(f"wrote {_save_merged(before, repeats=repeats, impl=impl).relative_to(ROOT)}")


def _save_merged(before, **meta):
    """Save what this run measured into results/figures.json, re-reading the file under a lock first, so
    that two runs for different modules at the same time both keep their numbers."""
    with open(ROOT / "results" / ".figures.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            merged = results.load("figures")["data"]
        except FileNotFoundError:
            merged = {}
        merged.update({key: value for key, value in DATA.items() if key != "figures" and value != before.get(key)})
        merged.setdefault("figures", {}).update(DATA.get("figures", {}))
        return results.save("figures", merged, **meta)

