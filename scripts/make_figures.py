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
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import gpt  # noqa: E402
from exercises.harness import IMPL_ENV, implementation  # noqa: E402
from scripts import figures  # noqa: E402

OUT_DIR = ROOT / "slides" / "figures"
DPI = 110
PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
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
        cost = figures.measure_generation(self.generators, self.model, self.prompt_ids, LENGTHS)
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


def _machine():
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU, {torch.get_num_threads()} threads"


# ----------------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description="Regenerate slides/figures/*.png from the project's code.")
    p.add_argument("--module", type=int, nargs="+", choices=sorted(REGISTRY), help="only these modules (default: all)")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=("exercises", "solutions"))
    p.add_argument("--device", default="cpu", help="cpu (default, as the slides say) or cuda")
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    args = p.parse_args()

    selected = [(m, name, fn) for m in sorted(REGISTRY) if not args.module or m in args.module for name, fn in REGISTRY[m]]
    if args.list:
        for m, name, fn in selected:
            print(f"module {m}: {name}  ({fn.__name__})")
        return
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(impl=args.impl, device=args.device)
    for m, name, fn in selected:
        start = time.perf_counter()
        fig = fn(ctx)
        fig.savefig(args.out / name, dpi=DPI)
        plt.close(fig)
        print(f"module {m}: wrote {(args.out / name).relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out / name}"
              f" ({time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
