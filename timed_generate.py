"""Naive generation against KV-cache generation, over growing numbers of new tokens.

    python timed_generate.py                          # tiny model on a CPU; GPT-2-sized random weights on a GPU
    python timed_generate.py --impl exercises         # time your own exercises 1 and 2
    python timed_generate.py --model gpt2 --device cuda --lengths 64 128 256 512 --plot kv.png
    python timed_generate.py --save                   # also write results/timed_generate.json (what the README quotes)

Both generate greedily from the same prompt and must agree token for token. The end-of-sequence
token is ignored so that every run produces exactly the number of tokens asked for. Each time is
the median of --repeats runs, naive and KV cache alternating (the speed-up is the median of the
paired ratios); the last column counts the token positions each pushed through the model.

Where the time goes: a step runs the same few dozen torch operations whatever its length, and each has a
fixed cost (a kernel launch on a GPU, Python and dispatch on a CPU). Where that fixed cost is most of a
step, naive and cached steps take the same time although naive does far more work ("bound by launches"
on a GPU, "overhead" on a CPU); the KV cache pays once naive's recomputation costs more than that
("compute"). On a GPU a small model stays launch-bound to long lengths, hence the bigger default there.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import gpt
from workshop import results
from workshop.grading.harness import (
    IMPL_ENV,
    IMPLS,
    count_model_work,
    count_torch_ops,
    implementation,
    paired_timing,
    run_script,
)

NO_EOS = -1  # a token id that never comes: generate exactly max_new_tokens


def parse_args():
    p = argparse.ArgumentParser(description="Time naive vs KV-cache greedy generation.")
    p.add_argument("--model", help="tiny, tiny-draft, gpt2..., a path, or random-124M... (default: tiny on a CPU, random-124M "
                                   "on a GPU, where the tiny model is launch-bound at every length)")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help="whose exercises 1 and 2 to time (default: the reference solutions)")
    p.add_argument("--lengths", type=int, nargs="+",
                   help="numbers of new tokens (default: 16 32 64 128 256 on a CPU; on a GPU 32 128 512 and up to the context)")
    p.add_argument("--prompt", default="ROMEO:\nWhat light through yonder window breaks?")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: steady timings even on a busy machine; raise it for big models)")
    p.add_argument("--plot", metavar="FILE", help="also save a plot of time against new tokens")
    p.add_argument("--save", action="store_true", help="write results/timed_generate.json (the file the README quotes)")
    return p.parse_args()


def main():
    args = parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    on_gpu = torch.device(args.device).type == "cuda"
    args.model = args.model or ("random-124M" if on_gpu else "tiny")
    naive = implementation("ex1_generate", args.impl).generate
    cached = implementation("ex2_kv_cache", args.impl).generate
    model = gpt.load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    prompt = gpt.load_tokenizer().encode(args.prompt)
    longest = model.config.n_positions - len(prompt)
    lengths = args.lengths or ([n for n in (32, 128, 512) if n < longest] + [longest] if on_gpu else [16, 32, 64, 128, 256])
    naive(model, prompt, 2, NO_EOS), cached(model, prompt, 2, NO_EOS)  # warm-up: first calls pay one-off costs
    ops = ops_per_step(cached, model, prompt)
    print(f"{args.model} ({model.num_parameters() / 1e6:.1f}M parameters) on {args.device}, {args.dtype}, "
          f"{args.impl}/, prompt of {len(prompt)} tokens, median of {args.repeats} runs\n")
    print(f"{'new tokens':>10} {'naive (s)':>10} {'KV cache (s)':>13} {'speedup':>8} {'ms/token, KV':>13} {'bound by':>9} "
          f"{'tokens through the model':>26}")
    rows, measured = [], {}
    for n in lengths:
        naive_run, cached_run = counted(naive, model, prompt, n), counted(cached, model, prompt, n)
        timing = paired_timing(naive_run, cached_run, repeats=args.repeats, warmup=0, device=args.device)
        if cached_run.tokens != naive_run.tokens:
            sys.exit(f"KV-cache generate disagrees with naive generate at {n} new tokens: fix exercise 2 first "
                     f"(pytest exercises/test_ex2_kv_cache.py).")
        rows.append((n, statistics.median(timing.seconds_a), statistics.median(timing.seconds_b), timing.ratio))
        work = f"{naive_run.work.tokens:,} vs {cached_run.work.tokens:,}"
        bound = bound_by(timing.ratio, on_gpu)
        measured[str(n)] = {"naive_s": rows[-1][1], "kv_cache_s": rows[-1][2], "speedup": timing.ratio,
                            "kv_cache_ms_per_token": rows[-1][2] / n * 1e3, "bound_by": bound,
                            "naive_token_passes": naive_run.work.tokens, "kv_cache_token_passes": cached_run.work.tokens}
        print(f"{n:>10} {rows[-1][1]:>10.3f} {rows[-1][2]:>13.3f} {timing.ratio:>7.1f}x {rows[-1][2] / n * 1e3:>13.2f} {bound:>9} "
              f"{work:>26}", flush=True)
    cost = "kernel launch on a GPU" if on_gpu else "Python and dispatch on a CPU"
    print(f"\nA KV-cache step runs {ops} torch operations whatever the length, each with a fixed cost ({cost}). Where that is\n"
          f"most of a step, naive and cached steps take the same time although naive recomputes the whole sequence\n"
          f"(bound by {'launches' if on_gpu else 'overhead'}); the KV cache pays where naive's recomputation costs more (compute).")
    if args.plot:
        plot(rows, args)
        print(f"\nwrote {args.plot}")
    if args.save:
        data = {"model": args.model, "parameters": model.num_parameters(), "dtype": args.dtype, "impl": args.impl,
                "prompt": args.prompt, "prompt_tokens": len(prompt), "torch_ops_per_step": ops, "lengths": measured}
        path = results.save("timed_generate", data, repeats=args.repeats, device=args.device,
                            wall_s=time.perf_counter() - started)
        print(f"\nwrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


BOUND_BY_SPEEDUP = 1.3  # below it, naive's extra work hardly shows: the step's fixed costs dominate


def bound_by(speedup, on_gpu):
    """What a row's time is bound by: the steps' fixed costs (kernel launches on a GPU, Python and dispatch on
    a CPU) where naive's many times more work hardly shows, else the compute the KV cache saves."""
    if speedup >= BOUND_BY_SPEEDUP:
        return "compute"
    return "launches" if on_gpu else "overhead"


def ops_per_step(generate, model, prompt):
    """Torch operations one decode step runs: those of 2 new tokens minus those of 1 (the prefill)."""
    return count_torch_ops(lambda: generate(model, prompt, 2, NO_EOS)) - count_torch_ops(lambda: generate(model, prompt, 1, NO_EOS))


def counted(generate, model, prompt, n):
    """A call of generate(model, prompt, n) that keeps its output and the work it pushed through the model."""
    def run():
        with count_model_work(model) as run.work:
            run.tokens = generate(model, prompt, n, NO_EOS)
    return run


def plot(rows, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths, naive_s, cached_s, _ = zip(*rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(lengths, naive_s, "o-", label="naive (whole sequence every step)")
    ax.plot(lengths, cached_s, "o-", label="KV cache (one token per step)")
    ax.set(xlabel="new tokens", ylabel="seconds", title=f"Greedy generation, {args.model} on {args.device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    run_script(main)
