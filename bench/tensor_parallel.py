"""Tensor parallelism on the CPU: time per generated token with the model split over W = 1, 2, 4
processes (gloo), the share of it spent inside all-reduce, and the bytes communicated per token.

    python bench/tensor_parallel.py                       # tiny model, the reference exercise 9, a minute or two
    python bench/tensor_parallel.py --impl exercises      # your own exercise 9
    python bench/tensor_parallel.py --save                # also write results/tensor_parallel.json (what the docs quote)
    python bench/tensor_parallel.py --model random-124M --world-sizes 1 2

Every rank is a process with one torch thread (workshop.distributed.ProcessPool: the same processes for
every W). A run prefills a --prompt-tokens prompt, then times --new-tokens greedy decode steps of
exercise 9's ParallelGPT with exercise 2's KV cache, each step on its own; a token's time is the
median step. The time inside torch.distributed.all_reduce (the call and its wait, so the waiting for
the slowest rank too) is clocked in every step on every rank: the share is each rank's median step
share, averaged over the ranks. "1 process" is the
single-process model (exercise 2's forward), no process group at all: what each replica would run if
the W processes served W requests side by side instead (replication, data parallelism). The rounds
take turns over the configurations (--repeats rounds); each reported row is the median round.
Bytes per token: the all-reduces' payload, counted (2 per block, n_embd values each), and what each
rank sends under a ring all-reduce, 2 (W - 1) / W x the payload (a formula: gloo picks its own
algorithm for small messages). Also the latency of one such all-reduce alone, at each W.
"""

import argparse
import os
import statistics

import torch

import gpt
from workshop.figures import parallel as parallel_plots
from workshop import results
from workshop.distributed import ProcessPool
from workshop.grading.harness import IMPL_ENV, IMPLS, run_script
from workshop.serving.workloads import sample_prompts


def parse_args():
    p = argparse.ArgumentParser(description="Time per token of tensor-parallel decoding on the CPU, W = 1, 2, 4.")
    p.add_argument("--model", default="tiny")
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help=f"whose exercise 9 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="rounds over every configuration; each row is the median round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write results/tensor_parallel.json (the file the docs quote)")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    module_name = f"{args.impl}.ex9_tensor_parallel"
    model = gpt.load_model(args.model, device="cpu")
    config = model.config
    prompt = sample_prompts(gpt.load_model("tiny", device="cpu"), 1, args.prompt_tokens, args.prompt_tokens, args.seed)[0]
    configurations = [0, *args.world_sizes]  # 0: one process, no group
    runs = {w: [] for w in configurations}
    with ProcessPool(max_world_size=max(args.world_sizes)) as pool:
        for round_ in range(args.repeats):
            for w in configurations if round_ % 2 == 0 else reversed(configurations):
                runs[w].append(pool.run(parallel_plots.decode_on_rank, max(w, 1), module_name, args.model, prompt,
                                        args.new_tokens, w == 0, timeout_s=600))
            print(f"round {round_ + 1}/{args.repeats}: " + ", ".join(
                f"{'1 process' if w == 0 else f'W={w}'} {1e3 * statistics.median(runs[w][-1][0]['step_seconds']):.2f} ms"
                for w in configurations), flush=True)
        latency = {w: statistics.median(pool.run(parallel_plots.all_reduce_latency, w, config.n_embd)) for w in args.world_sizes}

    single = runs[0]
    expected = single[0][0]["tokens"]
    data = {"model": args.model, "impl": args.impl, "n_layer": config.n_layer, "n_embd": config.n_embd, "n_head": config.n_head,
            "parameters": model.num_parameters(), "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
            "single_process": {"ms_per_token": 1e3 * statistics.median(statistics.median(r[0]["step_seconds"]) for r in single)},
            "world_sizes": {}}
    for w in args.world_sizes:
        row = parallel_plots.summarize(runs[w])
        row["ring_bytes_sent_per_rank_per_token"] = parallel_plots.ring_bytes_per_rank(row["payload_bytes_per_token"], w)
        row["all_reduce_latency_us"] = 1e6 * latency[w]
        row["slowdown_vs_single_process"] = row["ms_per_token"] / data["single_process"]["ms_per_token"]
        row["outputs_identical"] = all(rank["tokens"] == expected for ranks in runs[w] for rank in ranks)
        data["world_sizes"][str(w)] = row
    split = [row for w, row in data["world_sizes"].items() if int(w) > 1] or list(data["world_sizes"].values())
    best = min(split, key=lambda r: r["ms_per_token"])  # the fastest true split (W > 1)
    data["replication_tokens_per_s_2_processes"] = 2e3 / data["single_process"]["ms_per_token"]
    data["best_tensor_parallel_tokens_per_s"] = 1e3 / best["ms_per_token"]

    print(f"\n{args.model} ({config.n_layer} layers, n_embd {config.n_embd}), prompt {len(prompt)} tokens, {args.new_tokens} "
          f"decode steps, median of {args.repeats} rounds, 1 thread per process:")
    print(f"  1 process (no group)  {data['single_process']['ms_per_token']:6.2f} ms/token")
    for w, row in data["world_sizes"].items():
        print(f"  W = {w:<18} {row['ms_per_token']:6.2f} ms/token, {row['all_reduce_share']:5.1%} inside all-reduce "
              f"({row['all_reduces_per_token']:.0f} per token, {row['payload_bytes_per_token']:,.0f} B payload, "
              f"{row['ring_bytes_sent_per_rank_per_token']:,.0f} B sent per rank in a ring; one all-reduce alone "
              f"{row['all_reduce_latency_us']:.0f} us); outputs identical: {row['outputs_identical']}")
    if args.save:
        print(f"wrote {results.save('tensor_parallel', data, args.repeats, device='cpu', threads_per_process=1).relative_to(results.ROOT)}")


if __name__ == "__main__":
    run_script(main)
