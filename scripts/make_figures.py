"""Regenerate the slides' figures (slides/figures/*.png) from the project's own code.

    python scripts/make_figures.py                # every module's figures
    python scripts/make_figures.py --module 2     # only module 2's
    python scripts/make_figures.py --list         # what would be drawn

Each figure is a function registered with @figure(module, filename); it gets a shared Context (model,
tokenizer, the implementation under WORKSHOP_IMPL, default: the reference solutions) and returns a
matplotlib Figure. To add a module's figures, add a section of such functions below. The timings are
measured on the machine that runs this script: run it on a quiet machine.
"""

import argparse
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]

import torch

import gpt
from workshop.harness import IMPL_ENV, implementation
from workshop.workloads import mixed_workload, sample_prompts
from workshop import generation_plots as figures, serving, serving_plots

OUT_DIR = ROOT / "slides" / "figures"
DPI = 110
PROMPT = "First Citizen:\nBefore we proceed any further, hear me"
LENGTHS = [16, 32, 64, 128, 256]  # new tokens for the timing figures
REGISTRY = {}  # module number -> [(filename, function)]


def figure(module, filename):
    def register(fn):
        REGISTRY.setdefault(module, []).append((filename, fn))
        return fn
    return register


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

    @functools.cached_property
    def cost(self):
        """Naive and KV-cache generate timed and counted together, once, for every figure that needs it."""
        cost = figures.measure_generation(self.generators, self.model, self.prompt_ids, LENGTHS, repeats=self.repeats)
        print(cost.table())
        return cost


# ----------------------------------------------------------------------------------------------
# Module 1: naive generate

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
    return figures.plot_generation_cost(ctx.cost.only("naive"), len(ctx.prompt_ids),
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
    return figures.plot_generation_cost(ctx.cost, len(ctx.prompt_ids), title=f"naive vs KV cache, tiny model, {_machine()}")


@figure(2, "02_causal_masks.png")
def causal_masks(ctx):
    return figures.plot_causal_masks(ctx.module("ex2_kv_cache").causal_mask)


# ----------------------------------------------------------------------------------------------
# Modules 3 and 4: static and continuous batching (measuring: workshop/serving.py, drawing: workshop/serving_plots.py)

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


def _sweep(ctx):
    def measure():
        workload = mixed_workload(ctx.model, 24, prompt_len=(8, 32), output_len=(4, 48), seed=0)
        ex3, ex4 = ctx.module("ex3_static_batching"), ctx.module("ex4_continuous_batching")
        runs = serving.sweep_batch_sizes({"static": lambda b: serving.run_static(ex3, ctx.model, workload, b),
                                                  "continuous": lambda b: serving.run_continuous(ex4, ctx.model, workload, b)},
                                                 BATCH_SIZES, repeats=2)
        print(serving.table(runs))
        return runs
    return _serving(ctx, "sweep", measure)


@figure(3, "03_left_padding.png")
def left_padding(ctx):
    texts = ["ROMEO:\nWhat light", "First Citizen:\nBefore we proceed any further, hear me speak.", "JULIET:\nO Romeo, Romeo!", "KING:"]
    batch = ctx.module("ex3_static_batching").left_pad([ctx.tokenizer.encode(t) for t in texts])
    return serving_plots.plot_left_padding(*batch, ctx.tokenizer)


@figure(3, "03_static_timeline.png")
def static_timeline(ctx):
    static, _, tokens = _timeline_runs(ctx)
    timeline = serving.static_timeline([len(out) for out in static.outputs], 4)
    return serving_plots.plot_timelines([timeline], ["static batching, 4 slots"], tokens=tokens)


@figure(3, "03_batch_size_sweep.png")
def static_sweep(ctx):
    runs = {"static": _sweep(ctx)["static"]}
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
    return serving_plots.plot_latency_distributions(runs)


def _machine():
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    return f"CPU, {threads} thread{'s' if threads > 1 else ''}"


# ----------------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description="Regenerate slides/figures/*.png from the project's code.")
    p.add_argument("--module", type=int, nargs="+", choices=sorted(REGISTRY), help="only these modules (default: all)")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=("exercises", "solutions"))
    p.add_argument("--device", default="cpu", help="cpu (default, as the slides say) or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1, as in the notebooks: steady timings even on a busy machine)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per length for the timing figures (median)")
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    args = p.parse_args()

    selected = [(m, name, fn) for m in sorted(REGISTRY) if not args.module or m in args.module for name, fn in REGISTRY[m]]
    if args.list:
        for m, name, fn in selected:
            print(f"module {m}: {name}  ({fn.__name__})")
        return
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(impl=args.impl, device=args.device, repeats=args.repeats)
    for m, name, fn in selected:
        start = time.perf_counter()
        fig = fn(ctx)
        fig.savefig(args.out / name, dpi=DPI)
        plt.close(fig)
        print(f"module {m}: wrote {(args.out / name).relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out / name}"
              f" ({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
