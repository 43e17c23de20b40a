"""The workshop's GPU side in one call, under 10 minutes on one H100 or H200: run it once on a machine with a GPU.

    PYTHONPATH=. python scripts/gpu_check.py        # from the repository root (no install needed)
    python scripts/gpu_check.py --cpu-dry-run       # no GPU: the same plumbing on the CPU with small settings,
                                                    # its results files in a temporary folder
    PYTHONPATH=. python scripts/gpu_check.py --results-dir $OUT/results --logs $OUT/logs
                                                    # a lent machine: everything written where it comes back from

Steps, each a subprocess with its own time limit, in a process group of its own that is killed whole when
the step ends or runs out of time (so nothing of a step outlives it to slow the next); the whole within
--budget-s seconds (default 540: a lent machine's 10-minute command, its start included). Each step's measured
time is beside its definition in make_steps (H100 and H200, torch 2.11; about 490 s in all, estimated from them):
  decode        bench/decode_bandwidth.py: batch-1 decode of exercise 2's generate (random-124M, float16) as a
                share of the measured copy bandwidth (weights and KV bytes read per step / step time / bandwidth)
  checkers      pytest exercises/ --impl solutions on CUDA (pytest-xdist workers): pass / fail counts, failing ids;
                when a check's GPU failure (a device-side assert) cut a worker short, the grading conftest skips that
                worker's later checks and names their files, and checkers_rerun runs those files again in fresh
                processes: the record keeps both counts
  demo          timed_generate.py with its GPU defaults (random-124M, 32 new tokens up to the context)
  graphs        bench/cuda_graphs.py on random-124M: decode steps eager against replayed CUDA graphs at batch 1, 8
                and 32, and exercise 5's engine against exercise 11's with graphs off and on
  graphs_float16  the same in float16 (cuda_graphs_float16_<card>.json)
  serving       bench/serving.py on random-124M: the mixed workload through every engine, greedy and sampled, where
                each engine's step goes, exercise 11's engine with overlap scheduling against without, and issue 35's
                GPU targets (exercise 11's engine >= 80% of the decode ceiling at batch 32, >= 4x generate_batch;
                sampled >= 0.9x greedy; in the results file's targets)
  attention     bench/attention.py: its CUDA section, SDPA's flash and math backends and exercise 10's tiles
  serving_float16  the serving step in float16, the dtype a GPU serves in (serving_float16_<card>.json), sized to
                fit: 64 requests, one round, no Poisson run, no step split (128 requests over 2 rounds did not end in
                160 s on an H200)
  piecewise     bench/piecewise_graphs.py on random-124M in float16 (module 12, issue 43): a mixed step's kernels eager
                against compiled (the profiler's device kernels), exercise 5's engine against exercise 12's on graphs (full
                and piecewise) with and without compile, and issue 43's targets (graphs on >= 95% of steps, the compiled
                engine on graphs >= 3x exercise 5's; piecewise_graphs_float16_<card>.json). Not yet run on a card: its
                limit is a guess (three Inductor compiles, 13 x 11 piece graphs), and it takes the check past --budget-s:
                run it alone with --steps piecewise
  decode_again  the decode step once more, last: is it still as fast as at the start? (float16 decode once ran
                ten times slower in later calls than in the first; a leftover process is one suspect)

Before measuring, and before every step, it records the GPU's state from nvidia-smi (clocks, temperature,
power, the compute processes on the card) and warns when another process uses the GPU. It writes
results/gpu_check_<card>.json (each step's status, duration, command and result; the checkers' counts and
failing test ids; the GPU's state) beside the files the steps save (decode_bandwidth_<card>.json,
timed_generate_<card>.json, serving_<card>.json, serving_rows_<card>.{json,csv}, attention_<card>.json,
cuda_graphs_<card>.json, and the float16 runs' serving_float16_<card>.json and cuda_graphs_float16_<card>.json), and
prints a short table last. Each step's whole output is in --logs.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

STEPS = ("decode", "checkers", "demo", "graphs", "graphs_float16", "serving", "attention", "serving_float16", "piecewise",
         "decode_again")
DEFAULT_STEPS = tuple(step for step in STEPS if step != "piecewise")  # module 12's step is asked for by name (its docstring)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="The workshop's GPU check: checkers on CUDA, the demo, the benchmarks, "
                                            "batch-1 decode against the memory bandwidth; results files that name the card.")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run the plumbing on the CPU with small settings (tiny model, few requests, one checker file), "
                        "whether or not a GPU is here; results into a temporary folder unless --results-dir")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(DEFAULT_STEPS), metavar="STEP",
                   help=f"the steps to run, in this order: {' '.join(STEPS)} (default: all but piecewise)")
    p.add_argument("--budget-s", type=float, default=540, help="the steps' time limit in seconds, all together (default 540: with the start and the "
                                                                    "GPU state, under a lent machine's 10 minutes a command)")
    p.add_argument("--results-dir", help="where the results files go (default: results/; a dry run: a new temporary folder)")
    p.add_argument("--logs", help="where each step's output goes (default: a new temporary folder)")
    p.add_argument("--checkers", nargs="+", metavar="PATH",
                   help="what pytest checks (default: exercises/; a dry run: exercises/test_ex1_generate.py)")
    p.add_argument("--checker-workers", type=int, help="pytest-xdist workers (default: 8, for 16 cores; a dry run: 0, none)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch  # after the arguments: --help needs no torch

    if not args.cpu_dry_run and not torch.cuda.is_available():
        sys.exit("scripts/gpu_check.py needs a CUDA GPU and torch sees none here (run it with --cpu-dry-run to try its plumbing on the CPU).")
    started = time.monotonic()
    deadline = started + args.budget_s
    if args.cpu_dry_run and not args.results_dir:
        args.results_dir = tempfile.mkdtemp(prefix="gpu_check_results_")
    if args.results_dir:
        os.environ["WORKSHOP_RESULTS_DIR"] = str(Path(args.results_dir).resolve())  # read by workshop.results and the steps
    from workshop import gpu_check as check
    from workshop import results

    device = "cpu" if args.cpu_dry_run else "cuda"
    card = results.card(device) if device == "cuda" else "cpu"
    logs = Path(args.logs or tempfile.mkdtemp(prefix=f"gpu_check_{card}_logs_")).resolve()
    logs.mkdir(parents=True, exist_ok=True)
    print(f"GPU check on {torch.cuda.get_device_name() if device == 'cuda' else 'the CPU (a dry run of the plumbing)'}: steps "
          f"{', '.join(args.steps)} within {args.budget_s:.0f} s; results into {results.RESULTS_DIR}, logs into {logs}", flush=True)

    state_before = check.gpu_state()
    warnings = []
    for line in check.describe_state(state_before):
        print(f"  {line}")
    others = check.other_processes(state_before)
    if others:
        warnings.append(f"before the check, other processes use the GPU: {others} (their work slows every timing here)")
        print(f"WARNING: {warnings[-1]}", flush=True)

    made, checkers_rerun = make_steps(args, device, logs, results)
    steps = {s.name: s for s in made}
    records = []

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")  # run_step's `finally` kills the running step's group

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    interrupted = None
    try:
        for name in args.steps:
            step = steps[name]
            before = check.gpu_state()
            seen = check.other_processes(before)
            if seen:
                warnings.append(f"before {name}: other processes on the GPU: {seen}")
                print(f"WARNING: {warnings[-1]}", flush=True)
            record = check.run_step(step, logs, deadline)
            record["processes_before"] = seen
            record["clocks_before"] = [{k: g.get(k) for k in ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "pstate",
                                                               "clock_reasons_active")} for g in before.get("gpus", [])]
            records.append(record)
            if record.get("rerun_files"):  # a GPU failure skipped the rest of some workers' checks: again, in fresh processes
                records.append(check.run_step(checkers_rerun(record["rerun_files"]), logs, deadline))
    except (KeyboardInterrupt, SystemExit) as error:
        interrupted = str(error) or type(error).__name__
        print(f"interrupted: {interrupted}", flush=True)
    compare_decodes(records, warnings)
    state_after = check.gpu_state()
    wall_s = time.monotonic() - started
    data = {"card": torch.cuda.get_device_name() if device == "cuda" else None, "dry_run": args.cpu_dry_run,
            "passed": all(r["status"] == "passed" for r in records) and len(records) == len(args.steps) and not interrupted,
            "wall_s": wall_s, "budget_s": args.budget_s, "steps": records, "warnings": warnings, "interrupted": interrupted,
            "gpu_state_before": state_before, "gpu_state_after": state_after, "logs": str(logs),
            "torch": torch.__version__, "cuda": torch.version.cuda}
    path = results.save("gpu_check", data, repeats=1, device=device)
    for warning in warnings:
        print(f"WARNING: {warning}")
    print(f"\nwrote {shown(path, results)}; logs in {logs}; {wall_s:.0f} s in all\n")
    print(check.summary_table(records), flush=True)
    if interrupted:
        sys.exit(1)


def make_steps(args, device, logs, results):
    """The check's steps on `device` (a dry run: the same commands with small settings on the CPU)."""
    from workshop.gpu_check import Step, checker_counts, files_to_rerun

    dry = args.cpu_dry_run
    results_json = logs / "checkers_results.json"
    workers = args.checker_workers if args.checker_workers is not None else (0 if dry else 8)
    checkers = args.checkers or (["exercises/test_ex1_generate.py"] if dry else ["exercises/"])
    again_dir = logs / "decode_again"

    def load(name, folder=None):
        file = Path(folder or results.RESULTS_DIR) / f"{results.file_name(name, device)}.json"
        return json.loads(file.read_text())["data"]

    def checkers_summary(record, output):
        counts, failing = checker_counts(output, results_json)
        rerun = files_to_rerun(output)
        return {"counts": counts, "failing": failing, "results_json": str(results_json), "rerun_files": rerun,
                "note": (", ".join(f"{n} {word}" for word, n in counts.items()) or "no pytest summary line")
                        + (f"; a GPU failure cut {len(rerun)} files short: rerun" if rerun else "")}

    def decode_summary(record, output, folder=None):
        d = load("decode_bandwidth", folder)
        step_ms, share = d["time"]["step_s"] * 1e3, d["share_of_bandwidth_limit"]
        return {"step_ms": step_ms, "per_token_ms": d["time"]["per_token_s"] * 1e3, "share_of_bandwidth_limit": share,
                "bandwidth_bytes_per_s": d["bandwidth"]["bytes_per_s"],
                "note": (f"{d['model']} {d['dtype']}: {step_ms:.2f} ms a step, {share:.1%} of the bandwidth limit "
                         f"({d['bytes']['bytes_per_step'] / 1e6:.0f} MB a step at {d['bandwidth']['bytes_per_s'] / 1e9:,.0f} GB/s "
                         f"read + written)")}

    def demo_summary(record, output):
        lengths = load("timed_generate")["lengths"]
        return {"note": "KV cache / naive speed-up " + ", ".join(f"{v['speedup']:.1f}x at {n} ({v.get('bound_by', '?')})"
                                                                  for n, v in lengths.items())}

    def serving_summary(record, output, name="serving"):
        data = load(name)
        overlap = data.get("overlap")
        return {"note": "output tok/s " + ", ".join(f"{label} {e['metrics']['output_throughput']:,.0f}" for label, e in data["engines"].items())
                        + (f"; {overlap['engine']} overlap on / off {overlap['on_over_off']:.2f}" if overlap else "")}

    def attention_summary(record, output):
        cuda = load("attention")["cuda"]
        if not cuda.get("available"):
            return {"note": "CUDA section skipped: no GPU"}
        longest = max(cuda["prefill"], key=int)
        row = cuda["prefill"][longest]
        return {"note": f"prefill {longest}: SDPA flash {row['sdpa_flash_ms']:.2f} ms, math {row['sdpa_math_ms']:.2f} ms"}

    def piecewise_summary(record, output, name="piecewise_graphs_float16"):
        d = load(name)
        k, t = d["kernels"], d["targets"]
        best = d["engine"].get("graphs_compiled") or d["engine"].get("compiled", {})
        share = t.get("steps_on_graphs", {}).get("share", float("nan"))
        return {"note": (f"a {k['tokens']}-token step: {k['eager']} kernels eager, {k['compiled']} compiled; compiled engine "
                         f"{best.get('tokens_per_s', float('nan')):,.0f} tok/s = {t['compiled_over_eager']['ratio']:.2f}x exercise 5 "
                         f"(target >= 3x on a GPU), {share:.0%} of steps on graphs (target >= 95%)")}

    def graphs_summary(record, output, name="cuda_graphs"):
        d = load(name)
        one = d["steps"].get("1", {})
        engines = (d.get("engine") or {}).get("engines", {})
        over = one.get('replayed', {}).get('over_ex5', float('nan'))
        return {"note": (f"batch 1: exercise 5 {one.get('ex5', {}).get('ms', float('nan')):.2f} ms, replayed "
                         f"{one.get('replayed', {}).get('ms', float('nan')):.2f} ms ({over:.1f}x, issue 35's target >= 3x: "
                         f"{'met' if over >= 3 else 'NOT met'}); "
                         + ", ".join(f"{label} {e['tokens_per_s']:,.0f} tok/s" for label, e in engines.items()))}

    decode = ["bench/decode_bandwidth.py", "--device", device, "--save"]
    decode_small = ["--new-tokens", "8", "--copy-mib", "8", "--copy-repeats", "2"] if dry else []
    pytest = ["-m", "pytest", *checkers, "--impl", "solutions", "-p", "no:cacheprovider", f"--results-json={results_json}",
              *(["-n", str(workers)] if workers else [])]
    if dry:
        demo = ["timed_generate.py", "--model", "tiny", "--device", "cpu", "--dtype", "float32", "--lengths", "4", "8", "--repeats", "1"]
        serving = ["bench/serving.py", "--model", "tiny", "--device", "cpu", "--requests", "6", "--batch-size", "3", "--output-len", "2",
                   "12", "--repeats", "1", "--docs", str(results.RESULTS_DIR / "docs")]
        attention = ["--byte-lengths", "256", "--counted-up-to", "256", "--prefill-lengths", "64", "--decode-lengths", "64",
                     "--repeats", "1"]
        cuda_graphs = ["--device", "cpu", "--batch-sizes", "1", "2", "--requests", "4", "--batch-size", "4", "--output-len", "2", "8",
                       "--repeats", "1", "--steps", "1", "--engine-repeats", "1", "--copy-mib", "8"]
        sampled = []
        serving_float16 = serving
        piecewise = ["--device", "cpu", "--dtype", "float32", "--requests", "3", "--output-len", "2", "6", "--prompt-len", "4", "12",
                     "--repeats", "1", "--tokens", "8"]
    else:
        demo = ["timed_generate.py", "--device", "cuda", "--repeats", "1"]  # its GPU defaults: random-124M, 32 tokens to the context
        serving = ["bench/serving.py", "--model", "random-124M", "--device", "cuda", "--requests", "128", "--batch-size", "32",
                   "--repeats", "2"]
        attention = []
        cuda_graphs = ["--model", "random-124M", "--device", "cuda", "--engine-repeats", "3"]
        sampled = ["--temperature", "1"]  # what a default user gets: sampled as well as greedy
        serving_float16 = [*serving[:serving.index("--requests")], "--requests", "64", "--batch-size", "32", "--repeats", "1",
                           "--rate", "0"]
        piecewise = ["--model", "random-124M", "--device", "cuda", "--dtype", "float16", "--requests", "64", "--batch-size", "32",
                     "--budget", "256", "--repeats", "2"]

    def checkers_rerun(files):
        """The files a GPU failure cut short, again, each in a fresh process (pytest-xdist, one file a worker)."""
        rerun_json = logs / "checkers_rerun_results.json"
        argv = ["-m", "pytest", *files, "--impl", "solutions", "-p", "no:cacheprovider", f"--results-json={rerun_json}",
                "-n", str(min(len(files), max(workers, 1))), "--dist", "loadfile"]

        def summary(record, output):
            counts, failing = checker_counts(output, rerun_json)
            return {"counts": counts, "failing": failing, "files": files,
                    "note": f"{len(files)} files in fresh processes: " + (", ".join(f"{n} {w}" for w, n in counts.items()) or "no summary")}
        return Step("checkers_rerun", argv, 120, summarize=summary)

    steps = [
        # Each step's time as measured (H100 2026-11-26, H200 2026-11-28, torch 2.11) and its limit:
        Step("decode", [*decode, *decode_small, "--repeats", "1" if dry else "5"], 45, summarize=decode_summary),  # 31 s (H100)
        Step("checkers", pytest, 150, summarize=checkers_summary),  # 369 checks: 114 s (H200, 8 workers); 309: 92 s (H100, 4)
        Step("demo", [*demo, "--save"], 40, summarize=demo_summary),  # 37 s with 2 repeats (H100); 1 repeat now, not yet timed
        Step("serving", [*serving, *sampled, "--skip-eval", "--skip-spec", "--kv-budget", "0", "--no-progress", "--save"], 190,
             summarize=serving_summary),  # 166 s (H200); 30 s of it overlap on against off (the paged-graphs engines capture graphs)
        # float16: the dtype a GPU serves in. 128 requests over 2 rounds did not end in 160 s (H200); half the requests,
        # one round, no Poisson run, no step split: under a third of the work (the one-by-one baseline and the
        # one-by-one reference outputs are most of it), not yet timed on a card.
        Step("serving_float16", [*serving_float16, "--dtype", "float16", "--skip-eval", "--skip-spec", "--kv-budget", "0",
                                 "--skip-overlap", "--skip-step-split", "--no-progress", "--save"], 100,
             summarize=lambda record, output: serving_summary(record, output, "serving_float16")),
        Step("attention", ["bench/attention.py", *attention, "--save"], 20, summarize=attention_summary),  # 7 s (H100)
        Step("graphs", ["bench/cuda_graphs.py", *cuda_graphs, "--save"], 45, summarize=graphs_summary),  # 22 s (H200)
        Step("graphs_float16", ["bench/cuda_graphs.py", *cuda_graphs, "--dtype", "float16", "--save"], 50,  # 34 s (H200)
             summarize=lambda record, output: graphs_summary(record, output, "cuda_graphs_float16")),
        Step("piecewise", ["bench/piecewise_graphs.py", *piecewise, "--save"], 150,  # not yet timed on a card
             summarize=lambda record, output: piecewise_summary(record, output, "piecewise_graphs" if dry else "piecewise_graphs_float16")),
        Step("decode_again", [*decode, *decode_small, "--repeats", "1" if dry else "3"], 30,  # about 20 s (3 of decode's 5 repeats)
             env={"WORKSHOP_RESULTS_DIR": str(again_dir)},  # beside the logs: results/ keeps the first, fresh decode
             summarize=lambda record, output: decode_summary(record, output, again_dir)),
    ]
    return steps, checkers_rerun


def compare_decodes(records, warnings):
    """The decode step at the end against the one at the start: a slowdown within one call says which way to look."""
    by_name = {r["name"]: r for r in records}
    first, again = by_name.get("decode", {}), by_name.get("decode_again", {})
    if "step_ms" in first and "step_ms" in again:
        ratio = again["step_ms"] / first["step_ms"]
        again["slowdown_vs_first"] = ratio
        again["note"] = f"{again['note']}; {ratio:.2f}x the first decode's step"
        if ratio > 1.5:
            warnings.append(f"batch-1 decode got {ratio:.1f}x slower between the first step and the last of this check")


def shown(path, results):
    path = Path(path).resolve()
    return path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path


if __name__ == "__main__":
    main()
