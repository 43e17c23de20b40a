"""Naive generation against KV-cache generation, over growing numbers of new tokens.

    python timed_generate.py                          # embedded tiny model, reference solutions
    python timed_generate.py --impl exercises         # time your own exercises 1 and 2
    python timed_generate.py --model gpt2 --device cuda --lengths 64 128 256 512 --plot kv.png
    python timed_generate.py --save                   # also write results/timed_generate.json (what the README quotes)

Both generate greedily from the same prompt and must agree token for token. The end-of-sequence
token is ignored so that every run produces exactly the number of tokens asked for. Each time is
the median of --repeats runs, naive and KV cache alternating (the speed-up is the median of the
paired ratios); the last column counts the token positions each pushed through the model.
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
    implementation,
    paired_timing,
    run_script,
)

NO_EOS = -1  # a token id that never comes: generate exactly max_new_tokens


def parse_args():
    p = argparse.ArgumentParser(description="Time naive vs KV-cache greedy generation.")
    p.add_argument("--model", default="tiny", help="tiny (default), tiny-draft, gpt2..., a path, or random-124M...")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help="whose exercises 1 and 2 to time (default: the reference solutions)")
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256], help="numbers of new tokens")
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
    naive = implementation("ex1_generate", args.impl).generate
    cached = implementation("ex2_kv_cache", args.impl).generate
    model = gpt.load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    prompt = gpt.load_tokenizer().encode(args.prompt)
    naive(model, prompt, 2, NO_EOS), cached(model, prompt, 2, NO_EOS)  # warm-up: first calls pay one-off costs
    print(f"{args.model} ({model.num_parameters() / 1e6:.1f}M parameters) on {args.device}, {args.dtype}, "
          f"{args.impl}/, prompt of {len(prompt)} tokens, median of {args.repeats} runs\n")
    print(f"{'new tokens':>10} {'naive (s)':>10} {'KV cache (s)':>13} {'speedup':>8} {'tokens through the model':>26}")
    rows, measured = [], {}
    for n in args.lengths:
        naive_run, cached_run = counted(naive, model, prompt, n), counted(cached, model, prompt, n)
        timing = paired_timing(naive_run, cached_run, repeats=args.repeats, warmup=0, device=args.device)
        if cached_run.tokens != naive_run.tokens:
            sys.exit(f"KV-cache generate disagrees with naive generate at {n} new tokens: fix exercise 2 first "
                     f"(pytest exercises/test_ex2_kv_cache.py).")
        rows.append((n, statistics.median(timing.seconds_a), statistics.median(timing.seconds_b), timing.ratio))
        work = f"{naive_run.work.tokens:,} vs {cached_run.work.tokens:,}"
        measured[str(n)] = {"naive_s": rows[-1][1], "kv_cache_s": rows[-1][2], "speedup": timing.ratio,
                            "naive_token_passes": naive_run.work.tokens, "kv_cache_token_passes": cached_run.work.tokens}
        print(f"{n:>10} {rows[-1][1]:>10.3f} {rows[-1][2]:>13.3f} {timing.ratio:>7.1f}x {work:>26}", flush=True)
    if args.plot:
        plot(rows, args)
        print(f"\nwrote {args.plot}")
    if args.save:
        data = {"model": args.model, "parameters": model.num_parameters(), "dtype": args.dtype, "impl": args.impl,
                "prompt": args.prompt, "prompt_tokens": len(prompt), "lengths": measured}
        path = results.save("timed_generate", data, repeats=args.repeats, device=args.device,
                            wall_s=time.perf_counter() - started)
        print(f"\nwrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


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
