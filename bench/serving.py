"""Serving benchmark: one seeded mixed workload through several engines, side by side, in one process.

    python bench/serving.py                                   # tiny model, CPU, reference engines: a few minutes
    python bench/serving.py --impl exercises                  # your own exercises 3, 4 and 5
    python bench/serving.py --save                            # also write results/serving.json (what the README quotes)
    python bench/serving.py --model random-124M --device cuda --requests 256 --batch-size 32

Engines, all greedy on the same weights:
  one-by-one          exercise 2's KV-cache generate, one request after the other (the baseline)
  hf-static           transformers' generate on left-padded batches of --batch-size, in order
  hf-continuous       transformers' continuous batching (the engine of its generate_batch)
  static              exercise 3 (--impl: the reference solutions by default, or your exercises/)
  continuous          exercise 4, every request there at once
  continuous-poisson  exercise 4, requests arriving as a Poisson process at --rate per second
  paged               exercise 5, continuous batching on a paged KV cache, every request there at once
                      (a pool of --batch-size whole contexts, exercise 4's worst case)

The end-of-sequence token is ignored (every request produces exactly its max_new_tokens), so the
engines do the same work. Every output is compared with the same request generated alone by the
reference (the one-by-one engine). The engines take turns over --repeats rounds, and each reported
run is the median one by wall-clock time; speed-ups are medians of the per-round ratios.

Then three measurements on the same settings:
  KV memory   the token slots each cache holds at its peak, and the share of them holding a token
              (summed over the steps): exercise 4's left-padded batch (rows x width, watched at the
              fullest moment of each step), contiguous reservation on exercise 4's schedule (each
              running request holds prompt + max_new_tokens slots from its admission), and exercise
              5's pool (blocks in use x --block-size)
  KV budget   a pool of --kv-budget token slots and --budget-requests requests. Contiguous: every row
              of exercise 4's batch may grow to the model's whole context (n_positions), so the budget
              guarantees budget // n_positions rows. Paged: the largest max_batch_size with which
              exercise 5 on a pool of budget / block_size blocks serves the workload WITHOUT preempting
              anyone (found by bisection). Tokens/s of exercise 4 at the contiguous batch, and of
              exercise 5 at that batch and at its own, taking turns over --repeats rounds
  ceiling     tokens/s of one bare forward of B new tokens ([B, 1], no cache to attend to) at the
              engines' batch size and at the paged batch, and each engine's tokens/s as a share of it
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
                   help=f"whose exercises 3, 4 and 5 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--rate", type=float, default=20.0, help="requests per second of the continuous-poisson run (0: leave it out)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of every engine; each reported run is the median one")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-hf", action="store_true", help="leave out the two transformers engines")
    p.add_argument("--block-size", type=int, default=16, help="token slots per KV block of the paged engine")
    p.add_argument("--kv-budget", type=int, default=4096, help="token slots of the KV-budget experiment (0: leave it out)")
    p.add_argument("--budget-requests", type=int, help="requests of the KV-budget experiment (default: 4 x --requests)")
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
    ex5 = paged_engine(args.impl)
    model = gpt.load_model(args.model, device=args.device)
    lengths = dict(prompt_len=tuple(args.prompt_len), output_len=tuple(args.output_len), seed=args.seed)
    workload = mixed_workload(model, args.requests, **lengths)
    engines = {
        "one-by-one": lambda w: serving.run_one_by_one(ex2.generate, model, w),
        "static": lambda w: serving.run_static(ex3, model, w, args.batch_size),
        "continuous": lambda w: serving.run_continuous(ex4, model, w, args.batch_size),
        "paged": lambda w: serving.run_paged(ex5, model, w, args.batch_size, block_size=args.block_size),
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
    labels, ceilings = list(engines), []
    for r in range(args.repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:  # each round starts with another engine
            run = engines[label](workload)
            run.label = label
            samples[label].append(run)
            identical[label].append(sum(a == b for a, b in zip(run.outputs, expected)))
        ceilings.append(serving.decode_ceiling(model, args.batch_size))  # once a round: a burst of load hits one sample
    runs = {label: serving.median_run(samples[label]) for label in engines}

    print(serving.table({label: [run] for label, run in runs.items()}))
    print()
    for label in engines:
        print(f"{label}: {min(identical[label])}/{len(expected)} outputs identical to the request generated alone")
    speedups = {name: statistics.median(a.seconds / b.seconds for a, b in zip(samples[slow], samples[fast]))
                for name, (slow, fast) in SPEEDUPS.items() if slow in samples and fast in samples}
    for name, value in speedups.items():
        print(f"{name.replace('_', ' ')}: {value:.2f}x (median of the per-round ratios)")

    kv_memory = measure_kv_memory(args, model, workload, ex4, runs["paged"].result)
    kv_budget, budget_ceilings = budget_experiment(args, model, ex2, ex4, ex5, lengths) if args.kv_budget else (None, None)
    ceiling = ceiling_record(args, runs, ceilings, kv_budget, budget_ceilings)
    if args.save:
        data = {"workload": {"model": args.model, "parameters": model.num_parameters(), "impl": args.impl,
                             "requests": args.requests, "batch_size": args.batch_size, "prompt_len": args.prompt_len,
                             "output_len": args.output_len, "seed": args.seed, "rate": args.rate or None,
                             "tokens": sum(workload.max_new_tokens)},
                "engines": {label: record(run, samples[label], min(identical[label])) for label, run in runs.items()},
                "speedups": speedups, "kv_memory": kv_memory, "ceiling": ceiling}
        if kv_budget:
            data["kv_budget"] = kv_budget
        path = results.save("serving", data, repeats=args.repeats, device=args.device, wall_s=time.perf_counter() - started)
        print(f"\nwrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


def paged_engine(impl):
    """Exercise 5's module from `impl`; a checkout that has no exercises/ex5 yet is one not implemented."""
    try:
        return implementation("ex5_paged_kv_cache", impl)
    except ModuleNotFoundError as error:
        if error.name != f"{impl}.ex5_paged_kv_cache":
            raise
        raise NotImplementedError(f"{impl}/ex5_paged_kv_cache.py does not exist in this checkout.") from None


def measure_kv_memory(args, model, workload, ex4, paged_result):
    """Peak slots and utilisation of each KV cache on the bench's workload (all there at once): exercise
    4's batch and contiguous reservation watched on one more run of exercise 4, the paged pool from the
    paged engine's reported run. Deterministic: the schedule does not depend on the clock."""
    watched = serving.continuous_kv_memory(ex4, model, workload, args.batch_size)
    paged = serving.paged_kv_memory(paged_result)
    memory = {"paged": {**paged.record(), "block_size": args.block_size, "peak_blocks": paged_result.stats.peak_blocks}}
    if watched:
        batch, reservation = watched
        memory = {"contiguous_reservation": reservation.record(), "continuous": batch.record(), **memory}
    print(f"\nKV memory at batch size {args.batch_size}, token slots held (per layer) and the share holding a token, summed over the steps:")
    names = {"contiguous_reservation": "contiguous reservation (prompt + max_new_tokens each)",
             "continuous": "exercise 4, one left-padded batch", "paged": f"exercise 5, paged, blocks of {args.block_size}"}
    for key, m in memory.items():
        print(f"  {names[key]:<56}{m['peak_slots']:>7} peak slots{m['utilization']:>6.0%} utilised")
    if not watched:
        print("  (exercise 4's running batch could not be watched: this engine is not laid out like the reference's)")
    return memory


def budget_experiment(args, model, ex2, ex4, ex5, lengths):
    """The largest batch that a fixed KV budget of args.kv_budget slots fits with contiguous reservation
    (every row may grow to the model's context) and with paging (the largest max_batch_size that runs
    the workload on the same slots, as budget / block_size blocks, without one preemption), and the
    throughput at each, on a workload of --budget-requests requests all there at once. Returns the
    record and the decode ceiling at the paged batch, measured once a round."""
    budget, block_size, context = args.kv_budget, args.block_size, model.config.n_positions
    num_blocks = budget // block_size
    contiguous = budget // context
    if contiguous < 1:
        raise ValueError(f"--kv-budget {budget} holds no whole context of {context} positions: give at least {context} slots.")
    n = args.budget_requests or 4 * args.requests
    workload = mixed_workload(model, n, **lengths)
    print(f"\nKV budget of {budget} token slots ({num_blocks} blocks of {block_size}), {n} requests all there at once:", flush=True)

    searched = {}

    def fits(batch):
        result = serving.run_paged(ex5, model, workload, batch, num_blocks=num_blocks, block_size=block_size).result
        searched[batch] = {"max_batch": batch, "preemptions": result.stats.preemptions, "peak_blocks": result.stats.peak_blocks}
        print(f"  paged, max batch {batch:>3}: {result.stats.preemptions:>3} preemptions, peak {result.stats.peak_blocks} blocks", flush=True)
        return result.stats.preemptions == 0

    # the contiguous batch always fits the pool: each of its rows needs at most a whole context of blocks
    known_good = contiguous if num_blocks >= contiguous * -(-context // block_size) else 0
    most = min(n, num_blocks, 512)  # the paged engine's default token budget per step caps the batch at 512
    paged_batch = serving.largest_batch(fits, known_good, most)
    if paged_batch < 1:
        raise ValueError(f"--kv-budget {budget}: the paged engine cannot serve this workload on {num_blocks} blocks without preempting.")

    engines = {"contiguous": lambda: serving.run_continuous(ex4, model, workload, contiguous),
               "paged_same_batch": lambda: serving.run_paged(ex5, model, workload, contiguous, num_blocks=num_blocks, block_size=block_size),
               "paged": lambda: serving.run_paged(ex5, model, workload, paged_batch, num_blocks=num_blocks, block_size=block_size)}
    expected = [ex2.generate(model, p, k, NO_EOS) for p, k in zip(workload.prompts, workload.max_new_tokens)]
    samples, ceilings = {key: [] for key in engines}, []
    keys = list(engines)
    for r in range(args.repeats):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            samples[key].append(engines[key]())
        ceilings.append(serving.decode_ceiling(model, paged_batch))
    record = {"slots": budget, "block_size": block_size, "num_blocks": num_blocks, "n_positions": context, "requests": n,
              "tokens": sum(workload.max_new_tokens), "criterion": "largest max_batch_size without a preemption (bisection)",
              "search": [searched[b] for b in sorted(searched)]}
    for key, batch in (("contiguous", contiguous), ("paged_same_batch", contiguous), ("paged", paged_batch)):
        run = serving.median_run(samples[key])
        record[key] = {"max_batch": batch, "tokens_per_s": run.throughput, "seconds": run.seconds, "steps": run.steps,
                       "outputs_identical": min(sum(a == b for a, b in zip(s.outputs, expected)) for s in samples[key]),
                       "seconds_per_round": [s.seconds for s in samples[key]]}
        if key != "contiguous":
            stats = run.result.stats
            record[key] |= {"peak_blocks": stats.peak_blocks, "preemptions": stats.preemptions, "kv_utilization": stats.kv_utilization}
    for name, (slow, fast) in {"paged_over_continuous_same_batch": ("contiguous", "paged_same_batch"),
                               "paged_over_contiguous": ("contiguous", "paged")}.items():
        record[name] = statistics.median(a.seconds / b.seconds for a, b in zip(samples[slow], samples[fast]))
    names = {"contiguous": "exercise 4, contiguous (whole contexts)", "paged_same_batch": "exercise 5, paged, same batch",
             "paged": "exercise 5, paged, largest batch"}
    for key, name in names.items():
        r = record[key]
        print(f"  {name:<42} max batch {r['max_batch']:>3}{r['tokens_per_s']:>8.0f} tokens/s  "
              f"{r['outputs_identical']}/{n} outputs identical")
    same = record["paged_over_continuous_same_batch"]
    print(f"  paged / exercise 4 at the same batch: {same:.2f}x ({'as fast or faster' if same >= 1 else 'SLOWER'}); "
          f"paged at its batch / exercise 4 at its: {record['paged_over_contiguous']:.2f}x (medians of the per-round ratios)")
    return record, ceilings


def ceiling_record(args, runs, ceilings, kv_budget, budget_ceilings):
    """The decode ceiling (median of one measurement a round) at the engines' batch size, and at the
    paged budget batch, with each engine's tokens/s as a share of it."""
    tokens_per_s = statistics.median(ceilings)
    ceiling = {"batch_size": args.batch_size, "tokens_per_s": tokens_per_s, "tokens_per_s_per_round": ceilings,
               "fraction": {label: runs[label].throughput / tokens_per_s
                            for label in ("static", "continuous", "paged", "hf-static", "hf-continuous") if label in runs}}
    print(f"\nceiling: one bare forward of {args.batch_size} new tokens, {tokens_per_s:,.0f} tokens/s; "
          + ", ".join(f"{label} {share:.0%}" for label, share in ceiling["fraction"].items()))
    if kv_budget:
        batch, at = kv_budget["paged"]["max_batch"], statistics.median(budget_ceilings)
        ceiling["at_paged_batch"] = {"batch_size": batch, "tokens_per_s": at, "tokens_per_s_per_round": budget_ceilings,
                                     "fraction_paged": kv_budget["paged"]["tokens_per_s"] / at}
        print(f"ceiling at the paged budget batch {batch}: {at:,.0f} tokens/s; paged there {ceiling['at_paged_batch']['fraction_paged']:.0%}")
    return ceiling


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
