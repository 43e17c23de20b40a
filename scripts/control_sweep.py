"""Every negative control is caught at every seed, not at CI's alone: run each exercise's controls
(tests/controls/, through tests/control_runner.py) at several seeds and record, per seed, the controls that
escaped their checker in results/control_sweep.json. CI runs them at seed 7; a control caught there and
missed at another seed is a verdict that hangs on luck (issue 41), which a student would meet as a pass.

    python scripts/control_sweep.py                          # every exercise, seeds 11,23,37,41,53 (an hour or more on 2 cores)
    python scripts/control_sweep.py --exercises ex4 ex5 --seeds 11,23 --jobs 2   # merged into the record: run it in parts
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workshop import results

ROOT = Path(__file__).resolve().parents[1]
CONTROLS = sorted(p.stem for p in (ROOT / "tests" / "controls").glob("ex*.py"))
EXERCISES = sorted(p.stem.removeprefix("test_") for p in (ROOT / "exercises").glob("test_ex*.py"))


def controls_of(exercise):
    """The controls of an exercise: those whose EXERCISE is it (read from their source, not imported: the tests
    package is not installed, and the runner imports them in its own process)."""
    return [c for c in CONTROLS
            if re.search(rf'^EXERCISE = "{exercise}"', (ROOT / "tests" / "controls" / f"{c}.py").read_text(), re.M)]


def sweep(exercise, seed):
    """One exercise's controls at one seed, in one process: {control: the checks that caught it (empty: escaped)}."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tests.control_runner", exercise, *controls_of(exercise)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "CONTROL_SEED": str(seed)}, timeout=3600)
    rows = [json.loads(line[len("CONTROL "):]) for line in proc.stdout.splitlines() if line.startswith("CONTROL ")]
    caught = {r["control"]: r["failed"] if r["returncode"] == 1 and not r["todo"] else [] for r in rows}
    return {"caught": caught, "seconds": round(time.perf_counter() - start, 1)}


def load_record():
    path = results.RESULTS_DIR / "control_sweep.json"
    return json.loads(path.read_text())["data"]["exercises"] if path.exists() else {}


def save(exercise, seed, outcome):
    """Merge one exercise-seed run into results/control_sweep.json (earlier runs of other exercises and seeds are kept:
    the sweep can run in parts), and return the record."""
    data = load_record()
    controls = controls_of(exercise)
    entry = data.setdefault(exercise, {"controls": len(controls), "escaped": {}, "seconds": {}})
    entry["controls"] = len(controls)
    missing = set(controls) - set(outcome["caught"])  # the runner died before reporting them: escaped, and said so
    entry["escaped"][str(seed)] = sorted(c for c, checks in outcome["caught"].items() if not checks) + sorted(
        f"{c} (not reported)" for c in missing)
    entry["seconds"][str(seed)] = outcome["seconds"]
    runs = sum(entry["controls"] * len(entry["escaped"]) for entry in data.values())
    escaped = sum(len(cs) for entry in data.values() for cs in entry["escaped"].values())
    results.save("control_sweep", {"exercises": dict(sorted(data.items())), "runs": runs, "escaped": escaped}, repeats=1,
                 note="each exercise's negative controls (tests/controls) graded at each seed (CI's is 7); 'escaped' lists "
                      "those no check caught; runs = controls x seeds over every exercise recorded")
    return data


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exercises", nargs="*", default=[], help="exercises (ex4 or ex4_continuous_batching); default all")
    p.add_argument("--seeds", default="11,23,37,41,53", help="comma-separated seeds (default 11,23,37,41,53; CI's is 7)")
    p.add_argument("--jobs", type=int, default=2, help="exercise-seed runs side by side (default 2)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    exercises = [e for e in EXERCISES if not args.exercises or any(e == n or e.startswith(n + "_") for n in args.exercises)]
    jobs = [(e, s) for e in exercises if controls_of(e) for s in seeds]
    escaped = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for (exercise, seed), outcome in zip(jobs, pool.map(lambda job: sweep(*job), jobs)):
            data = save(exercise, seed, outcome)
            escaped += [(exercise, seed, c) for c in data[exercise]["escaped"][str(seed)]]
            print(f"{exercise} seed {seed}: {len(controls_of(exercise)) - len(data[exercise]['escaped'][str(seed)])} of "
                  f"{len(controls_of(exercise))} caught ({outcome['seconds']} s)", flush=True)
    print("".join(f"escaped: {e} seed {s}: {c}\n" for e, s, c in escaped) or "every control was caught at every seed")
    sys.exit(1 if escaped else 0)


if __name__ == "__main__":
    main()
