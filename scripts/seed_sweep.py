"""The references pass every checker on many consecutive seeds: run each checker's random checks
(`-m "not timing"`) against solutions/ for seeds 0..99 and record every failure in results/seed_sweep.json.

    python scripts/seed_sweep.py                              # every exercise, seeds 0..99 (hours on 2 cores)
    python scripts/seed_sweep.py --exercises ex1 ex4 --seeds 0-99
    python scripts/seed_sweep.py --exercises ex6_decoding --seeds 40-59 --jobs 2 -k top_p
    python scripts/seed_sweep.py --exercises ex11 --alternative ex11_one_buffer_and_explicit_softmax
    python scripts/seed_sweep.py -k differential --device-audit --jobs 2   # what a GPU would refuse, on the CPU

A student gets a new seed every run, so a check that fails the reference on one seed in ten fails a
correct solution one run in ten. One worker process per exercise imports torch once and runs a fresh
pytest session per seed (as tests/control_runner.py does for the negative controls); --jobs runs that
many exercises side by side. Results of earlier runs for other exercises or seeds are kept: the file
holds, per exercise, the seeds run, the failures (seed and check), and the seconds each seed took.
"""

import argparse
import fcntl
import json
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from workshop import results

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted(p.stem.removeprefix("test_") for p in (ROOT / "exercises").glob("test_ex*.py"))
NAME = "seed_sweep"


def run_seed(exercise, seed, extra):
    """One fresh pytest session of the exercise's checker on the references with this seed: the checks
    that failed (names) and the exit code."""
    import pytest

    from workshop.grading import harness

    for name in [n for n in sys.modules if n.startswith(("exercises.test_", "exercises.conftest"))]:
        del sys.modules[name]  # the checker and its conftest are imported anew: nothing carries over
    harness.REPLACEMENTS.clear()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.json"
        code = pytest.main([f"exercises/test_{exercise}.py", "-q", "-p", "no:cacheprovider", f"--seed={seed}",
                            f"--results-json={path}", "--impl=solutions", "-m", "not timing", *extra])
        tests = json.loads(path.read_text())["tests"] if path.exists() else []
    failed = [{"check": t["name"].split("::", 1)[-1], "output": t["output"][-1500:]} for t in tests if t["status"] != "passed"]
    if int(code) not in (0, 1) and not failed:  # no check ran at all (collection error, bad -k): say so
        failed = [{"check": "(session)", "output": f"pytest exited with code {int(code)}"}]
    return {"checks": len(tests), "failed": failed}


def worker(exercise, seeds, extra):
    """Runs in its own process: one line of JSON per seed on stdout."""
    import functools
    import io
    from contextlib import redirect_stdout

    import gpt

    # Building GPT-2's tokenizer takes seconds; the checkers only read it, so every session shares one.
    gpt.load_tokenizer = functools.lru_cache(maxsize=None)(gpt.load_tokenizer)
    for seed in seeds:
        start = time.perf_counter()
        with redirect_stdout(io.StringIO()):  # pytest's own report would drown the protocol lines
            outcome = run_seed(exercise, seed, extra)
        print("SEED " + json.dumps({"exercise": exercise, "seed": seed, "seconds": round(time.perf_counter() - start, 2),
                                    **outcome}), flush=True)


def parse_seeds(text):
    """'0-99' or '3,7,11' or '5' -> a list of ints."""
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def seed_ranges(seeds):
    """The inverse of parse_seeds, as short as it gets: [0, 1, 2, 5] -> '0-2,5'."""
    parts, seeds = [], sorted(seeds)
    for seed in seeds:
        if parts and seed == parts[-1][1] + 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in parts)


def pick_exercises(names):
    if not names:
        return EXERCISES
    picked = [e for e in EXERCISES if any(e == n or e.startswith(n + "_") for n in names)]
    unknown = [n for n in names if not any(e == n or e.startswith(n + "_") for e in EXERCISES)]
    if unknown:
        raise ValueError(f"no checker for {', '.join(unknown)}: pick from {', '.join(EXERCISES)} (or their prefixes ex0, ex1, ...).")
    return picked


def load_record():
    path = results.RESULTS_DIR / f"{NAME}.json"
    return json.loads(path.read_text())["data"] if path.exists() else {}


def save(entries):
    """Merge this run's entries into the file (other runs, side by side, may be writing theirs)."""
    results.RESULTS_DIR.mkdir(exist_ok=True)
    with open(results.RESULTS_DIR / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load_record()
        data.update(entries)
        results.save(NAME, dict(sorted(data.items())), repeats=1, checks='-m "not timing"', note=(
            "each exercise's checker on the references, one fresh pytest session per seed; failures list the seed and the "
            "check; each entry's command reproduces it"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exercises", nargs="*", default=[], help="exercises to sweep (ex4 or ex4_continuous_batching); default all")
    p.add_argument("--seeds", default="0-99", help="seeds: a range 0-99, a list 3,7,11, or both (default 0-99)")
    p.add_argument("--jobs", type=int, default=1, help="exercises swept side by side, one process each (default 1)")
    p.add_argument("-k", default=None, help="only the checks matching this pytest -k expression")
    p.add_argument("--alternative", default=None,
                   help="grade tests/alternatives/NAME (a correct design of another shape) in place of the reference")
    p.add_argument("--device-audit", action="store_true",
                   help="grade under the device audit (what a GPU would refuse: a tensor on the wrong device, an index out of range)")
    p.add_argument("--resume", action="store_true", help="skip the seeds the file already holds for an exercise (a full sweep's)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    extra = (["-k", args.k] if args.k else []) + (["--device-audit"] if args.device_audit else []) + (
        [f"--replace={args.worker}=tests.alternatives.{args.alternative}"] if args.alternative and args.worker else [])
    seeds = parse_seeds(args.seeds)
    if args.worker:
        return worker(args.worker, seeds, extra)

    exercises = pick_exercises(args.exercises)
    torch.set_num_threads(1)  # as the workers (the grading conftest): the file records it
    old = load_record()
    # One entry per exercise for the sweep of all its checks; a sweep of some (-k) has its own entry.
    if args.alternative and len(exercises) != 1:
        raise SystemExit("--alternative grades one exercise: name it with --exercises")
    key = {e: e + (f" -k {args.k}" if args.k else "") + (f" --alternative {args.alternative}" if args.alternative else "")
           + (" --device-audit" if args.device_audit else "") for e in exercises}
    data = {e: old.get(key[e], {"seeds": [], "failures": [], "seconds": {}}) for e in exercises}
    queue, running = list(exercises), {}
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            exercise = queue.pop(0)
            entry = data[exercise]
            todo = [s for s in seeds if not (args.resume and s in entry["seeds"])]
            if not todo:
                continue
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", exercise, "--seeds", ",".join(map(str, todo)),
                       *(["-k", args.k] if args.k else []), *(["--alternative", args.alternative] if args.alternative else []),
                       *(["--device-audit"] if args.device_audit else [])]
            running[exercise] = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            # the seeds the entry holds once this run is done (a rerun of some seeds keeps the others)
            entry["command"] = " ".join(["python", "scripts/seed_sweep.py", "--exercises", exercise, "--seeds",
                                         seed_ranges(set(entry["seeds"]) | set(todo)),
                                         *(["-k", repr(args.k)] if args.k else []),
                                         *(["--alternative", args.alternative] if args.alternative else []),
                                         *(["--device-audit"] if args.device_audit else [])])
            if args.k:
                entry["only"] = args.k
            if args.alternative:
                entry["alternative"] = args.alternative
        if not running:
            break
        ready = selectors.DefaultSelector()  # whichever worker has a line ready: none blocks the others
        for exercise, proc in running.items():
            ready.register(proc.stdout, selectors.EVENT_READ, exercise)
        for event, _ in ready.select():
            exercise, proc = event.data, running[event.data]
            line = proc.stdout.readline()
            if not line:  # the worker is done
                proc.wait()
                del running[exercise]
                continue
            if not line.startswith("SEED "):
                continue
            row = json.loads(line[len("SEED "):])
            entry = data[exercise]
            seed = row["seed"]
            entry["seeds"] = sorted(set(entry["seeds"]) | {seed})
            entry["failures"] = [f for f in entry["failures"] if f["seed"] != seed] + [
                {"seed": seed, "check": f["check"], "output": f["output"]} for f in row["failed"]]
            entry["seconds"][str(seed)] = row["seconds"]
            entry["checks"] = row["checks"]
            times = list(entry["seconds"].values())
            entry["seconds_per_seed"] = round(sum(times) / len(times), 2)
            save({key[exercise]: entry})
            status = "ok" if not row["failed"] else "FAILED " + ", ".join(f["check"] for f in row["failed"])
            print(f"{exercise} seed {seed}: {row['checks']} checks, {row['seconds']:.1f} s, {status}", flush=True)
        ready.close()
    failures = [(e, f["seed"], f["check"]) for e in exercises for f in data[e]["failures"] if f["seed"] in seeds]
    print(f"{len(failures)} failures" + "".join(f"\n  {e} seed {s}: {c}" for e, s, c in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
