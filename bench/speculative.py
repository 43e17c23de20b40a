"""Speculative decoding against plain KV-cache decoding at batch 1: does it pay, and for which k?

    python bench/speculative.py                    # tiny / tiny-draft, the reference exercise 7, a few minutes
    python bench/speculative.py --impl exercises   # your own exercise 7
    python bench/speculative.py --save             # also write results/speculative.json (what the docs quote)

Measured, all greedy with EOS ignored, one torch thread:
  draft      --draft with its output layer shortlisted (exercise 7's shortlist) to the --shortlist tokens
             most frequent in its training text (models/<draft>/token_frequencies.json; 0: the whole vocabulary)
  c          one draft decode step / one target decode step (median steps after --context cached tokens),
             with the shortlist and, for comparison, without it
  v(k)       one target forward of k + 1 new tokens / one target decode step (the verification's price)
  per k      alpha (accepted drafts / positions verified), the acceptance rate (accepted drafts / drafted
             tokens: exercise 7's SpeculativeStats.acceptance_rate, as docs/benchmarks.md), tokens per target forward, the wall-clock
             speed-up of speculative_generate over exercise 2's generate on --prompts prompts of
             --new-tokens tokens (median of --repeats paired rounds that alternate which runs first),
             and whether every output equals plain greedy decoding; Jacobi decoding's tokens per forward
  expected   Leviathan et al.'s (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)) from the measured alpha and c,
             and the same with the measured verification cost, k c + v(k), below the line
"""

import argparse
import os

import torch

import gpt
from workshop import results
from workshop.figures import speculative as speculative_plots
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import sample_prompts


def parse_args():
    p = argparse.ArgumentParser(description="Speculative vs plain decoding at batch 1: c, alpha and the speed-up for each k.")
    p.add_argument("--target", default="tiny")
    p.add_argument("--draft", default="tiny-draft")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help=f"whose exercise 7 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--shortlist", type=int, default=4096, help="tokens the draft's output layer scores (0: all of them)")
    p.add_argument("--ks", type=int, nargs="+", default=list(range(1, 9)))
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--context", type=int, default=64, help="cached tokens before the timed steps of c and v(k)")
    p.add_argument("--repeats", type=int, default=5, help="paired rounds per k; the speed-up is their median")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write results/speculative.json (the file the docs quote)")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    spec = implementation("ex7_speculative", args.impl)
    plain = implementation("ex2_kv_cache", "solutions").generate
    target, full_draft = gpt.load_model(args.target, device=args.device), gpt.load_model(args.draft, device=args.device)
    draft = spec.shortlist(full_draft, speculative_plots.frequent_tokens(args.draft, args.shortlist)) if args.shortlist else full_draft
    prompts = sample_prompts(target, args.prompts, 8, 32, args.seed)

    c, verify_cost = speculative_plots.measure_costs(target, draft, args.ks, args.context)
    c_full_head = speculative_plots.measure_costs(target, full_draft, [], args.context)[0] if args.shortlist else c
    print(f"{args.impl}/ex7_speculative.py, {args.target} ({target.num_parameters() / 1e6:.1f}M) / {args.draft} "
          f"({full_draft.num_parameters() / 1e6:.1f}M, output layer shortlisted to {args.shortlist or 'all'} tokens) on {args.device}: "
          f"c = {c:.3f} ({c_full_head:.3f} with its whole output layer); verifying k + 1 tokens costs " + ", ".join(f"{verify_cost[k]:.2f}" for k in args.ks)
          + " target steps", flush=True)
    rows = speculative_plots.sweep(spec, plain, target, draft, prompts, args.new_tokens, args.ks, args.repeats)
    alpha = sum(r["accepted"] for r in rows.values()) / max(1, sum(r["verified"] for r in rows.values()))
    for k, row in rows.items():
        row["expected_speedup"] = speculative_plots.expected_speedup(alpha, c, k)
        row["expected_speedup_measured_verify"] = speculative_plots.expected_speedup(alpha, c, k, verify_cost[k])
        row["expected_tokens_per_target_forward"] = speculative_plots.expected_tokens_per_round(alpha, k)
    best = max(rows, key=lambda k: rows[k]["speedup"])

    print(f"alpha (all k pooled) = {alpha:.3f}\n")
    print(" k   alpha  acceptance rate  tokens/forward (expected)  speed-up (expected; with v(k))  Jacobi tokens/forward  identical")
    for k, r in rows.items():
        print(f"{k:2d}   {r['alpha']:.3f}   {r['acceptance_rate']:.3f}            {r['tokens_per_target_forward']:5.2f} ({r['expected_tokens_per_target_forward']:5.2f})"
              f"           {r['speedup']:5.2f}x ({r['expected_speedup']:4.2f}x; {r['expected_speedup_measured_verify']:4.2f}x)"
              f"               {r['jacobi_tokens_per_forward']:5.2f}             {r['outputs_identical']}")
    print(f"\nbest k = {best}: {rows[best]['speedup']:.2f}x over plain decoding")
    if args.save:
        data = {"target": args.target, "draft": args.draft, "impl": args.impl, "shortlist": args.shortlist, "c_full_head": c_full_head,
                "target_parameters": target.num_parameters(), "draft_parameters": full_draft.num_parameters(),
                "prompts": args.prompts, "new_tokens": args.new_tokens, "context": args.context, "c": c, "alpha": alpha,
                "verify_cost": {str(k): v for k, v in verify_cost.items()}, "k": {str(k): r for k, r in rows.items()},
                "best_k": best, "best_speedup": rows[best]["speedup"], "best_tokens_per_target_forward": rows[best]["tokens_per_target_forward"]}
        path = results.save("speculative", data, repeats=args.repeats, device=args.device)
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


if __name__ == "__main__":
    run_script(main)
