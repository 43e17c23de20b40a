"""Serving benchmark: engines side by side in one process on the same weights, with vLLM's `bench serve`
metrics; optionally the OpenAI-compatible server (serve.py) over HTTP against the same engine.

    python bench/serving.py                       # tiny model, CPU, reference engines, every part but the server
    python bench/serving.py --save --temperature 1 --online --online-models tiny random-124M --online-requests 16 --online-output-len 8 48
        # the full run (about 16 minutes on a busy 2-core CPU): results/serving.json, results/serving_rows.{json,csv},
        # docs/benchmarks.md and its plots; starts serve.py itself, once per model
    python bench/serving.py --out runs.json       # one row per engine and load: runs.json and runs.csv
    python bench/serving.py --impl exercises      # your own exercises 3, 4 and 5
    python bench/serving.py --report              # rewrite docs/benchmarks.md and its plots from results/serving.json
    python bench/serving.py --only-sampling --save  # only greedy against temperature 1 (the paged engine); updates that part
                                                    # of results/serving.json (and its rows, docs and targets)
    python bench/serving.py --only-online --online-requests 16 --online-output-len 8 48 --repeats 9 --save
        # only serve.py against the same engine offline (tiny): updates that part of results/serving.json
    python bench/serving.py --model random-124M --device cuda --requests 256 --batch-size 32

Parts (each prints its table; --skip-* leaves one out):
  mixed workload  --requests requests (prompts --prompt-len, outputs --output-len) all there at once through
                  one-by-one (exercise 2's KV-cache generate), hf-static (transformers' generate, left-padded
                  batches), hf-continuous (transformers' continuous batching, the engine of generate_batch, at
                  max_requests_per_batch = --batch-size), static, continuous and paged (exercises 3, 4, 5, --impl),
                  on CUDA paged-graphs (exercise 11: exercise 5's engine, its decode steps on CUDA graphs; on a CPU
                  bench/cuda_graphs.py measures it, with graphs and without),
                  and continuous-poisson (exercise 4, the same requests arriving at --rate per second); with --temperature,
                  the paged engine greedy against sampling at that temperature (each request seeded). Then the KV
                  memory each cache holds, a fixed KV budget (--kv-budget slots), and the decode ceiling.
  overlap         the paged engine with overlap scheduling and without (workshop/serving/overlap.py: step n+1 scheduled
                  while step n runs), taking turns: on CUDA exercise 11's (paged-graphs, which runs with overlap above),
                  on a CPU exercise 5's, where overlap is off by default (--skip-overlap)
  step split      each stepping engine (continuous, paged; on CUDA paged-graphs) once more, watched: the time per step
                  in the forward, sampling, scheduling and bookkeeping, and the host reads per step (--only-step-split)
  evaluation      the course's: no batching (one-by-one), static, dynamic (a batch starts when full or after
                  --window s), continuous, paged, at --batch-size; --eval-requests requests, input --input-len,
                  outputs --eval-output-len; all at once, then Poisson arrivals at --load-factors x the capacity
                  (the best engine's request throughput all at once), or at --rates
  speculative     batch 1: exercise 7's speculative decoding (--draft, k = --spec-k) against exercise 2's generate
  online          with --online: serve.py (started on a free port, or the server at --base-url) driven by the
                  aiohttp client (as vLLM's bench serve), streaming, against the same engine (exercise 5's reference) in this process

The end-of-text token is ignored offline (every request produces exactly its max_new_tokens), so the
engines do the same work; outputs are compared with each request generated alone by exercise 2. The
engines take turns over --repeats rounds; each reported run is the median one by wall-clock time, each
ratio the median of the per-round ratios. Metrics: workshop.serving.runs.serving_metrics (completed, failed,
duration, request/output/total token throughput, goodput for --goodput SLOs, mean/median/p99 of TTFT,
TPOT, ITL, E2EL in ms).
"""

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

import gpt
from workshop import results
from workshop.serving import runs as serving
from workshop.serving import bench as serving_bench
from workshop.serving import report as serving_report
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import mixed_workload



def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Throughput and latency of serving engines, with vLLM's bench serve metrics.")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--dtype", choices=gpt.DTYPES, default="float32",
                   help="the weights' dtype, every engine's (float32: results/serving*.json; another: serving_<dtype>*.json)")
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
    p.add_argument("--goodput", nargs="*", default=["ttft:500", "tpot:25"], metavar="NAME:MS",
                   help="SLOs for goodput, as vLLM's: ttft:MS tpot:MS e2el:MS (default: ttft:500 tpot:25, a CPU-scale choice; "
                        "none: leave goodput out)")
    p.add_argument("--skip-hf", action="store_true", help="leave out the two transformers engines")
    p.add_argument("--block-size", type=int, default=16, help="token slots per KV block of the paged engine")
    p.add_argument("--temperature", type=float, default=None,
                   help="also run the paged engine on the mixed workload greedy and sampled at this temperature (OpenAI's default "
                        "is 1; --only-sampling takes 1 when none is given)")
    p.add_argument("--only-sampling", action="store_true",
                   help="only greedy against --temperature; with --save, update that part of results/serving.json")
    p.add_argument("--skip-overlap", action="store_true", help="leave out the paged engine with overlap scheduling against without")
    p.add_argument("--skip-step-split", action="store_true", help="leave out where each engine's step goes")
    p.add_argument("--only-step-split", action="store_true",
                   help="only where each engine's step goes (forward, sampling, scheduling, bookkeeping, host reads); with "
                        "--save, update that part of results/serving.json")
    p.add_argument("--only-online", action="store_true",
                   help="only serve.py against the same engine offline (the online part); with --save, update that part of "
                        "results/serving.json")
    p.add_argument("--kv-budget", type=int, default=4096, help="token slots of the KV-budget experiment (0: leave it out)")
    p.add_argument("--budget-requests", type=int, help="requests of the KV-budget experiment (default: 4 x --requests)")
    e = p.add_argument_group("the course's evaluation")
    e.add_argument("--skip-eval", action="store_true", help="leave the course's evaluation out")
    e.add_argument("--eval-requests", type=int, default=48)
    e.add_argument("--input-len", type=int, default=128, help="the fixed prompt length of the evaluation")
    e.add_argument("--eval-output-len", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    e.add_argument("--window", type=float, default=0.05, help="dynamic batching: the longest wait of a batch's oldest request (s)")
    e.add_argument("--load-factors", type=float, nargs=2, default=[0.3, 1.5], metavar=("LOW", "HIGH"),
                   help="the finite arrival rates as multiples of the capacity")
    e.add_argument("--rates", type=float, nargs="+", metavar="R", help="finite arrival rates (requests/s) instead of --load-factors")
    s = p.add_argument_group("speculative decoding at batch 1")
    s.add_argument("--skip-spec", action="store_true", help="leave speculative decoding out")
    s.add_argument("--draft", default="tiny-draft", help="the draft model (any name gpt.load_model takes)")
    s.add_argument("--spec-k", type=int, default=4, help="tokens the draft proposes per round")
    s.add_argument("--spec-requests", type=int, default=8)
    s.add_argument("--spec-output-len", type=int, nargs=2, default=[64, 192], metavar=("MIN", "MAX"))
    o = p.add_argument_group("online: serve.py over HTTP")
    o.add_argument("--online", action="store_true", help="also drive the server and compare it with the same engine offline")
    o.add_argument("--base-url", help="a running server's http://HOST:PORT/v1 (default: start serve.py on a free port)")
    o.add_argument("--online-models", nargs="+", metavar="MODEL",
                   help="serve each of these in turn (default: --model); e.g. tiny random-124M: the overhead at GPT-2's size")
    o.add_argument("--online-requests", type=int, default=32)
    o.add_argument("--online-output-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="max_tokens range (default: --output-len)")
    o.add_argument("--online-rate", type=float, default=float("inf"), help="requests per second (inf: all at once)")
    o.add_argument("--ignore-eos", action="store_true", help="ask the server to ignore EOS (vLLM's extension; the server must accept it)")
    w = p.add_argument_group("output")
    w.add_argument("--save", action="store_true", help="write results/serving.json (what the README quotes), results/serving_rows.json "
                                                       "and .csv, and docs/benchmarks.md with its plots; on a GPU results/serving_<card>.json "
                                                       "and serving_rows_<card>.{json,csv} (e.g. _h200), and the page only into --docs")
    w.add_argument("--out", help="write the rows (one per engine and load) to this JSON file and a .csv beside it (or FILE.csv and .json)")
    w.add_argument("--docs", help="where --save and --report write benchmarks.md and img/ (default: docs/, whose page quotes "
                                  "results/serving.json; a --save on a GPU writes a page only where --docs says)")
    w.add_argument("--report", action="store_true", help="only rewrite the docs page and plots from results/serving.json")
    w.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main():
    args = parse_args()
    if args.docs is None and (args.report or torch.device(args.device).type != "cuda"):
        args.docs = str(results.ROOT / "docs")  # docs/benchmarks.md is drawn from the CPU's results/serving.json
    if args.report:
        path = serving_report.write_report(results.load("serving"), args.docs)
        print(f"wrote {path}")
        return
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]  # the load says how busy the machine was
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    goodput = serving.parse_goodput(args.goodput)
    progress = not args.no_progress
    torch.set_num_threads(args.threads)
    modules = {"ex2": implementation("ex2_kv_cache", "solutions"),  # the baseline and the judge of every output: the reference
               "ex3": implementation("ex3_static_batching", args.impl),
               "ex4": implementation("ex4_continuous_batching", args.impl),
               "ex5": paged_engine(args.impl)}
    if torch.device(args.device).type == "cuda":  # paged-graphs: exercise 11's engine, its decode steps on CUDA graphs
        modules["ex11"] = implementation("ex11_cuda_graphs", args.impl)
    model = gpt.load_model(args.model, device=args.device, dtype=gpt.DTYPES[args.dtype])
    lengths = {"prompt_len": tuple(args.prompt_len), "output_len": tuple(args.output_len), "seed": args.seed}
    workload = mixed_workload(model, args.requests, **lengths)
    if args.only_online:
        return only_online(args, model, goodput, progress, started, load_at_start)
    if args.only_step_split:
        return only_step_split(args, model, modules, workload, progress, started, load_at_start)
    if args.only_sampling:
        return only_sampling(args, model, modules["ex5"], workload, goodput, progress, started, load_at_start)
    arriving = mixed_workload(model, args.requests, rate=args.rate, **lengths) if args.rate else None
    print(f"{args.model} on {args.device}, {args.impl}/ engines: {args.requests} requests, prompts of "
          f"{args.prompt_len[0]}-{args.prompt_len[1]} tokens, outputs of {args.output_len[0]}-{args.output_len[1]}, batch size "
          f"{args.batch_size}, all there at once{f' (continuous-poisson: {args.rate:g} requests/s)' if args.rate else ''}; "
          f"median of {args.repeats} rounds\n", flush=True)

    twin = None if args.skip_hf else serving.transformers_twin(model)
    runs, _, engines, speedups, ceilings = serving_bench.compare_engines(
        model, modules, workload, args.batch_size, args.repeats, arriving, args.block_size, twin, goodput, progress)
    print(serving.table({label: [run] for label, run in runs.items()}))
    print()
    print(serving_bench.metrics_table({label: e["metrics"] for label, e in engines.items()}))
    print()
    for label, e in engines.items():
        print(f"{label}: {e['outputs_identical']}/{args.requests} outputs identical to the request generated alone")
    for name, value in speedups.items():
        print(f"{name.replace('_', ' ')}: {value:.2f}x (median of the per-round ratios)")
    if "paged-graphs" in engines:
        engines["paged-graphs"]["overlap"] = True  # run_paged_graphs' default on CUDA: overlap scheduling
    overlap = (None if args.skip_overlap else
               serving_bench.overlap_on_vs_off(model, modules.get("ex11") or modules["ex5"], workload, args.batch_size, args.repeats,
                                               args.block_size, progress))

    split = (None if args.skip_step_split else
             serving_bench.step_split(model, modules, workload, args.batch_size, args.block_size, progress))
    sampling = (serving_bench.sampled_vs_greedy(model, modules["ex5"], workload, args.batch_size, args.temperature, args.repeats,
                                                args.seed, args.block_size, goodput, progress) if args.temperature else None)

    kv_memory = serving_bench.measure_kv_memory(model, workload, modules["ex4"], runs["paged"].result, args.batch_size, args.block_size)
    kv_budget, budget_ceilings = (serving_bench.budget_experiment(model, modules, lengths, args.kv_budget, args.block_size,
                                                                  args.budget_requests or 4 * args.requests, args.repeats, progress)
                                  if args.kv_budget else (None, None))
    ceiling = serving_bench.ceiling_record(args.batch_size, runs, ceilings, kv_budget, budget_ceilings)
    data = {"workload": {"model": args.model, "parameters": model.num_parameters(), "dtype": args.dtype, "impl": args.impl,
                         "requests": args.requests, "batch_size": args.batch_size, "prompt_len": args.prompt_len,
                         "output_len": args.output_len, "seed": args.seed, "rate": args.rate or None,
                         "tokens": sum(workload.max_new_tokens)},
            "goodput": goodput, "engines": engines, "speedups": speedups, "kv_memory": kv_memory, "ceiling": ceiling}
    if split:
        data["step_split"] = split
    if overlap:
        data["overlap"] = overlap
    if sampling:
        data["sampling"] = sampling
    if kv_budget:
        data["kv_budget"] = kv_budget
    if not args.skip_eval:
        data["evaluation"] = serving_bench.course_evaluation(
            model, modules, args.eval_requests, args.input_len, args.eval_output_len, args.batch_size, args.window,
            args.load_factors, args.rates, args.repeats, args.seed, args.block_size, goodput, progress)
    if not args.skip_spec:
        draft = gpt.load_model(args.draft, device=args.device, dtype=gpt.DTYPES[args.dtype])
        data["speculative"] = serving_bench.speculative_vs_plain(
            model, draft, args.draft, modules["ex2"], implementation("ex7_speculative", args.impl), args.spec_requests,
            args.prompt_len, args.spec_output_len, args.spec_k, args.repeats, args.seed, goodput, progress)
    if args.online:
        data["online"] = online(args, model, goodput, progress)
    data["targets"] = serving_bench.targets(data)
    print_targets(data["targets"])

    rows = serving_bench.rows(data)
    written = []
    if args.out:
        written += serving_bench.write_rows(rows, args.out)
    if args.save:
        path = results.save(results.with_dtype("serving", args.dtype), data, repeats=args.repeats, device=args.device, wall_s=time.perf_counter() - started,
                            load_average=[load_at_start, os.getloadavg()[0]])
        written += [path, *serving_bench.write_rows(rows, rows_path(args)), *write_page(args)]
    for path in written:
        print(f"wrote {shown(path)}")
    print(f"\n({time.perf_counter() - started:.0f} s)")


def only_sampling(args, model, ex5, workload, goodput, progress, started, load_at_start):
    """--only-sampling: the paged engine greedy against --temperature; with --save, that part of
    results/serving.json (its own command, date and load average beside it), the targets, rows and docs."""
    args.temperature = 1.0 if args.temperature is None else args.temperature
    if not args.temperature > 0:
        raise ValueError(f"--temperature is {args.temperature}: sampling needs a temperature above 0 (0 is greedy).")
    record = serving_bench.sampled_vs_greedy(model, ex5, workload, args.batch_size, args.temperature, args.repeats, args.seed,
                                             args.block_size, goodput, progress)
    record["measured"] = measured_here(args, started, load_at_start)
    if args.save:
        save_part(args, lambda data: data.update(sampling=record))
    print_targets(serving_bench.targets({"sampling": record}))


def only_step_split(args, model, modules, workload, progress, started, load_at_start):
    """--only-step-split: where each engine's step goes; with --save, that part of results/serving.json (its own
    command, date and load average beside it) and the docs."""
    record = serving_bench.step_split(model, modules, workload, args.batch_size, args.block_size, progress)
    record["measured"] = measured_here(args, started, load_at_start)
    if args.save:
        save_part(args, lambda data: data.update(step_split=record))


def only_online(args, model, goodput, progress, started, load_at_start):
    """--only-online: serve.py against its engine offline, for each of --online-models; with --save, that part
    of results/serving.json (its own command, date and load average beside it), the targets, rows and docs."""
    records = online(args, model, goodput, progress)
    measured = measured_here(args, started, load_at_start)
    for record in records:
        record["measured"] = measured

    def replace_online(data):
        kept = [o for o in data.get("online", []) if o["model"] not in {r["model"] for r in records}]
        data["online"] = [*records, *kept]

    if args.save:
        save_part(args, replace_online)
    print_targets(serving_bench.targets({"online": records}))


def measured_here(args, started, load_at_start):
    """How a part measured on its own (--only-...) was measured: it keeps its own command, date and load beside it."""
    return {"command": " ".join(["python", "bench/serving.py", *sys.argv[1:]]), "date": datetime.date.today().isoformat(),
            "machine": results.machine(args.device), "device": str(args.device), "repeats": args.repeats,
            "load_average": [load_at_start, os.getloadavg()[0]], "wall_s": time.perf_counter() - started}


def save_part(args, update):
    """Replace one part of results/serving.json (update(data) edits it), then its targets, rows and docs."""
    existing = results.load(results.with_dtype("serving", args.dtype), args.device)
    update(existing["data"])
    existing["data"]["targets"] = serving_bench.targets(existing["data"])
    path = results.RESULTS_DIR / f"{results.file_name(results.with_dtype('serving', args.dtype), args.device)}.json"
    path.write_text(json.dumps(existing, indent=1) + "\n")
    written = [path, *serving_bench.write_rows(serving_bench.rows(existing["data"]), rows_path(args)), *write_page(args)]
    for path in written:
        print(f"wrote {shown(path)}")


def rows_path(args):
    """results/serving_rows.json, beside results/serving.json (on a GPU serving_rows_<card>.json, as its record;
    in another dtype than float32 serving_rows_<dtype>...)."""
    return results.RESULTS_DIR / f"{results.file_name(results.with_dtype('serving_rows', args.dtype), args.device)}.json"


def write_page(args):
    """The docs page and plots from the record this run saved, into --docs; on a GPU only where --docs was given
    (docs/benchmarks.md quotes the CPU's results/serving.json). Returns the paths written."""
    if args.docs is None:
        print("docs/benchmarks.md left as it is: it quotes the CPU's results/serving.json (--docs DIR writes this run's page there)")
        return []
    return [serving_report.write_report(results.load(results.with_dtype("serving", args.dtype), args.device), args.docs)]


def online(args, model, goodput, progress):
    """serve.py (started here for each of --online-models, unless --base-url) against its engine in this
    process, the same requests. Returns a list of records, one per model."""
    from workshop.serving.client import launch_server

    rate = None if args.online_rate == float("inf") else args.online_rate
    options = {"requests": args.online_requests, "prompt_len": args.prompt_len, "output_len": args.online_output_len or args.output_len,
               "rate": rate, "batch_size": args.batch_size, "repeats": args.repeats, "ignore_eos": args.ignore_eos, "seed": args.seed,
               "goodput": goodput, "progress": progress}
    if args.base_url:
        return [serving_bench.online_vs_offline(model, args.base_url, **options)]
    records = []
    for name in args.online_models or [args.model]:
        served = model if name == args.model else gpt.load_model(name, device=args.device, dtype=gpt.DTYPES[args.dtype])
        with launch_server(name, args.batch_size) as base_url:
            records.append(serving_bench.online_vs_offline(served, base_url, **options))
    return records


def print_targets(targets):
    print("\ntargets:")
    for key, t in targets.items():
        if key == "sampled_over_greedy":
            line = f"{t['engine']}: temperature {t['temperature']:g} / greedy output throughput {t['ratio']:.2f} (>= {t['target']:g})"
        elif key.startswith("paged_of_ceiling"):
            line = f"{t['engine']} at batch {t['batch_size']}: {t['ratio']:.0%} of the decode ceiling (>= {t['target']:.0%})"
            line += f", its schedule allows {t['schedule_allows']:.0%}" if "schedule_allows" in t else ""
        elif key == "paged_kv_utilization":
            line = f"KV utilisation: paged {t['paged']:.0%} (> 90%), contiguous with the whole context reserved {t['contiguous_context']:.0%}"
        elif key == "server_overhead":
            for entry in t:
                print(f"  {entry['model']}: online / offline output throughput {entry['online_over_offline']:.2f} "
                      f"(>= {entry['target']:g}): {'met' if entry['met'] else 'NOT met'}")
            continue
        else:
            line = f"{t['engine']} / {t['baseline']} output throughput {t['ratio']:.2f}x (>= {t['target']:g}x)"
            line += f", its schedule allows {t['schedule_allows']:.2f}x" if "schedule_allows" in t else ""
        print(f"  {line}: {'met' if t['met'] else 'NOT met'}")


def paged_engine(impl):
    """Exercise 5's module from `impl`; a checkout that has no exercises/ex5 yet is one not implemented."""
    try:
        return implementation("ex5_paged_kv_cache", impl)
    except ModuleNotFoundError as error:
        if error.name != f"{impl}.ex5_paged_kv_cache":
            raise
        raise NotImplementedError(f"{impl}/ex5_paged_kv_cache.py does not exist in this checkout.") from None


def shown(path):
    path = Path(path).resolve()
    return path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path


if __name__ == "__main__":
    run_script(main)
