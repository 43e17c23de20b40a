"""Serving benchmark: one seeded mixed workload through several engines, side by side, in one process.

    python bench/serving.py                                   # tiny model, CPU, reference engines: a few minutes
    python bench/serving.py --impl exercises                  # your own exercises 3 and 4
    python bench/serving.py --save                            # also write results/serving.json (what the README quotes)
    python bench/serving.py --model random-124M --device cuda --requests 256 --batch-size 32

Engines, all greedy on the same weights:
  one-by-one          exercise 2's KV-cache generate, one request after the other (the baseline)
  hf-static           transformers' generate on left-padded batches of --batch-size, in order
  hf-continuous       transformers' continuous batching (the engine of its generate_batch)
  static              exercise 3 (--impl: the reference solutions by default, or your exercises/)
  continuous          exercise 4, every request there at once
  continuous-poisson  exercise 4, requests arriving as a Poisson process at --rate per second

The end-of-sequence token is ignored (every request produces exactly its max_new_tokens), so the
engines do the same work. Every output is compared with the same request generated alone by the
reference (the one-by-one engine). The engines take turns over --repeats rounds, and each reported
run is the median one by wall-clock time; speed-ups are medians of the per-round ratios.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import gpt
from workshop import results, serving
from workshop.harness import IMPL_ENV, IMPLS, implementation
from workshop.workloads import mixed_workload

NO_EOS = serving.NO_EOS
# (numerator, denominator): how many times faster the second engine's run is than the first's
SPEEDUPS = {"static_vs_one_by_one": ("one-by-one", "static"), "continuous_vs_one_by_one": ("one-by-one", "continuous"),
            "continuous_vs_static": ("static", "continuous"), "static_vs_hf_static": ("hf-static", "static"),
            "continuous_vs_hf_continuous": ("hf-continuous", "continuous")}


def parse_args():
    p = argparse.ArgumentParser(description="Throughput and latency of static and continuous batching engines.")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help=f"whose exercises 3 and 4 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--rate", type=float, default=20.0, help="requests per second of the continuous-poisson run (0: leave it out)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of every engine; each reported run is the median one")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-hf", action="store_true", help="leave out the two transformers engines")
    p.add_argument("--save", action="store_true", help="write results/serving.json (the file the README quotes)")
    return p.parse_args()


def main():
    args = parse_args()
    started = time.perf_counter()
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    torch.set_num_threads(args.threads)
    ex2 = implementation("ex2_kv_cache", "solutions")  # the baseline and the judge of every output: the reference
    ex3 = implementation("ex3_static_batching", args.impl)
    ex4 = implementation("ex4_continuous_batching", args.impl)
    model = gpt.load_model(args.model, device=args.device)
    lengths = dict(prompt_len=tuple(args.prompt_len), output_len=tuple(args.output_len), seed=args.seed)
    workload = mixed_workload(model, args.requests, **lengths)
    engines = {
        "one-by-one": lambda w: serving.run_one_by_one(ex2.generate, model, w),
        "static": lambda w: serving.run_static(ex3, model, w, args.batch_size),
        "continuous": lambda w: serving.run_continuous(ex4, model, w, args.batch_size),
    }
    if args.rate:
        arriving = mixed_workload(model, args.requests, rate=args.rate, **lengths)
        engines["continuous-poisson"] = lambda w: serving.run_continuous(ex4, model, arriving if w is workload else w, args.batch_size)
    if not args.skip_hf:
        twin = serving.transformers_twin(model)
        engines["hf-static"] = lambda w: serving.run_hf_static(twin, w, args.batch_size)
        engines["hf-continuous"] = lambda w: serving.run_hf_continuous(twin, w, args.batch_size)
    print(f"{args.model} on {args.device}, {args.impl}/ engines: {args.requests} requests, prompts of "
          f"{args.prompt_len[0]}-{args.prompt_len[1]} tokens, outputs of {args.output_len[0]}-{args.output_len[1]}, batch size "
          f"{args.batch_size}, all there at once{f' (continuous-poisson: {args.rate:g} requests/s)' if args.rate else ''}; "
          f"median of {args.repeats} rounds\n", flush=True)

    warm_up = mixed_workload(model, 2, **lengths)
    for run in engines.values():  # first calls pay one-off costs (allocations, transformers' manager)
        run(warm_up)
    expected = [ex2.generate(model, p, n, NO_EOS) for p, n in zip(workload.prompts, workload.max_new_tokens)]
    samples, identical = {label: [] for label in engines}, {label: [] for label in engines}
    labels = list(engines)
    for r in range(args.repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:  # each round starts with another engine
            run = engines[label](workload)
            run.label = label
            samples[label].append(run)
            identical[label].append(sum(a == b for a, b in zip(run.outputs, expected)))
    runs = {label: serving.median_run(samples[label]) for label in engines}

    print(serving.table({label: [run] for label, run in runs.items()}))
    print()
    for label in engines:
        print(f"{label}: {min(identical[label])}/{len(expected)} outputs identical to the request generated alone")
    speedups = {name: statistics.median(a.seconds / b.seconds for a, b in zip(samples[slow], samples[fast]))
                for name, (slow, fast) in SPEEDUPS.items() if slow in samples and fast in samples}
    for name, value in speedups.items():
        print(f"{name.replace('_', ' ')}: {value:.2f}x (median of the per-round ratios)")
    if args.save:
        data = {"workload": {"model": args.model, "parameters": model.num_parameters(), "impl": args.impl,
                             "requests": args.requests, "batch_size": args.batch_size, "prompt_len": args.prompt_len,
                             "output_len": args.output_len, "seed": args.seed, "rate": args.rate or None,
                             "tokens": sum(workload.max_new_tokens)},
                "engines": {label: record(run, samples[label], min(identical[label])) for label, run in runs.items()},
                "speedups": speedups}
        path = results.save("serving", data, repeats=args.repeats, device=args.device, wall_s=time.perf_counter() - started)
        print(f"\nwrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


def record(run, samples, identical):
    """One engine's numbers for results/serving.json (None where the engine does not report one)."""
    def median(values):
        return statistics.median(values) if values else None

    return {"label": run.label, "tokens": run.tokens, "seconds": run.seconds, "tokens_per_s": run.throughput,
            "occupancy": run.occupancy, "steps": run.steps, "median_latency_s": median(run.latency),
            "median_ttft_s": median(run.ttft), "median_tpot_s": median(run.tpot), "outputs_identical": identical,
            "seconds_per_round": [r.seconds for r in samples]}


if __name__ == "__main__":
    try:
        main()
    except (gpt.ModelLoadError, ValueError) as error:
        sys.exit(f"error: {error}")
    except NotImplementedError as error:
        sys.exit(f"error: not implemented yet. {error}")
