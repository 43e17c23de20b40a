"""Time the project's own test suite, the README's test command, and save how long it took.

    python scripts/time_test_suite.py --save          # writes results/test_suite.json (what the README quotes)
    python scripts/time_test_suite.py --full --save   # the same for `--full`, the long proofs too (its "full" entry)
    python scripts/time_test_suite.py --ci --save     # CI itself: .ci/run on a fresh clone of HEAD (its "ci" entry)
    python scripts/time_test_suite.py --checkers --save   # each checker as a student runs it, on the references (its "checkers" entry)

Run it on a quiet machine: the suite starts many processes (checkers, controls, notebooks, a server),
so anything else running beside it slows it down.
"""

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workshop import results

COMMAND = [sys.executable, "-m", "pytest", "tests/", "-n", "2", "-rs", "-q", "-p", "no:cacheprovider"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--save", action="store_true", help="write results/test_suite.json")
    p.add_argument("--full", action="store_true", help="time `--full`: the long proofs too (saved as the record's full entry)")
    p.add_argument("--ci", action="store_true", help="time .ci/run on a fresh clone of HEAD: a new venv, the install, then "
                                                     "the full tier (saved as the record's ci entry)")
    p.add_argument("--checkers", action="store_true", help="time each exercise's checker alone, as a student runs it (pytest "
                                                           "exercises/test_exN_*.py, on the references, timing checks included)")
    args = p.parse_args()
    if args.checkers:
        return time_checkers(args.save)
    start = time.perf_counter()
    if args.ci:
        with tempfile.TemporaryDirectory() as tmp:
            clone = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "--quiet", str(results.ROOT), str(clone)], check=True)
            proc = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True, text=True)
    else:
        proc = subprocess.run(COMMAND + (["--full"] if args.full else []), cwd=results.ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    lines = [line for line in proc.stdout.strip().splitlines() if re.search(r"\d+ (passed|failed)", line)]
    summary = lines[-1] if lines else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    print(f"{summary}\n{wall_s:.0f} s")
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-2000:])
        sys.exit("the test suite failed: nothing saved.")
    if args.save:
        command = "bash .ci/run (a fresh clone)" if args.ci else "python -m pytest tests/ -n 2 -rs" + (" --full" if args.full else "")
        entry = {"wall_s": wall_s, "wall_min": wall_s / 60, "counts": counts, "command": command}
        old = results.load("test_suite")["data"] if (results.RESULTS_DIR / "test_suite.json").exists() else {}
        kept = {k: old[k] for k in ("full", "ci", "checkers") if k in old}  # the quick tier replaces its own numbers only
        data = ({**old, "ci": entry} if args.ci else {**old, "full": entry} if args.full else {**entry, **kept})
        print(results.save("test_suite", data, repeats=1))


def time_checkers(save):
    """Each checker alone, one after the other, as `pytest exercises/test_exN_*.py` with the references graded: the wall
    time of the whole run (a student's budget is 2 minutes), the CPU time it used (the same on a quiet machine, and still
    true on a busy one), and the seconds its differential checks took."""
    checkers = sorted(p.stem for p in (results.ROOT / "exercises").glob("test_ex*.py"))
    entry = {}
    for checker in checkers:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            start, cpu_before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, "-m", "pytest", f"exercises/{checker}.py", "-q", "-p", "no:cacheprovider",
                                   "--impl=solutions", "--seed=7", f"--results-json={report}", "--durations=0", "-vv"],
                                  cwd=results.ROOT, capture_output=True, text=True)
            wall_s, cpu_after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
            tests = json.loads(report.read_text())["tests"] if report.exists() else []
        calls = re.findall(r"^([\d.]+)s call\s+\S+::(\S+)", proc.stdout, re.M)
        differential = sum(float(seconds) for seconds, name in calls if "differential" in name)
        entry[checker.removeprefix("test_")] = {"wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1), "differential_s": round(differential, 1),
                                                "checks": len(tests), "passed": sum(t["status"] == "passed" for t in tests)}
        print(f"{checker}: {wall_s:.0f} s ({cpu_s:.0f} s of CPU), differential checks {differential:.1f} s, {entry[checker.removeprefix('test_')]['passed']}/{len(tests)} passed")
    if save:
        old = results.load("test_suite")["data"] if (results.RESULTS_DIR / "test_suite.json").exists() else {}
        print(results.save("test_suite", {**old, "checkers": entry}, repeats=1))


if __name__ == "__main__":
    main()
