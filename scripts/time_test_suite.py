"""Time the project's own test suite, the README's test command, and save how long it took.

    python scripts/time_test_suite.py --save          # writes results/test_suite.json (what the README quotes)
    python scripts/time_test_suite.py --full --save   # the same for `--full`, the long proofs too (its "full" entry)

Run it on a quiet machine: the suite starts many processes (checkers, controls, notebooks, a server),
so anything else running beside it slows it down.
"""

import argparse
import re
import subprocess
import sys
import time

from workshop import results

COMMAND = [sys.executable, "-m", "pytest", "tests/", "-n", "2", "-rs", "-q", "-p", "no:cacheprovider"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--save", action="store_true", help="write results/test_suite.json")
    p.add_argument("--full", action="store_true", help="time `--full`: the long proofs too (saved as the record's full entry)")
    args = p.parse_args()
    start = time.perf_counter()
    proc = subprocess.run(COMMAND + (["--full"] if args.full else []), cwd=results.ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    print(f"{summary}\n{wall_s:.0f} s")
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-2000:])
        sys.exit("the test suite failed: nothing saved.")
    if args.save:
        entry = {"wall_s": wall_s, "wall_min": wall_s / 60, "counts": counts,
                 "command": "python -m pytest tests/ -n 2 -rs" + (" --full" if args.full else "")}
        old = results.load("test_suite")["data"] if (results.RESULTS_DIR / "test_suite.json").exists() else {}
        data = {**old, "full": entry} if args.full else {**entry, **({"full": old["full"]} if "full" in old else {})}
        print(results.save("test_suite", data, repeats=1))


if __name__ == "__main__":
    main()
