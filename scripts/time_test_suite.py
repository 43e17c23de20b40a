"""Time the project's own test suite, the README's test command, and save how long it took.

    python scripts/time_test_suite.py --save     # writes results/test_suite.json (what the README quotes)

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
    args = p.parse_args()
    start = time.perf_counter()
    proc = subprocess.run(COMMAND, cwd=results.ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    print(f"{summary}\n{wall_s:.0f} s")
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-2000:])
        sys.exit("the test suite failed: nothing saved.")
    if args.save:
        print(results.save("test_suite", {"wall_s": wall_s, "wall_min": wall_s / 60, "counts": counts,
                                          "command": "python -m pytest tests/ -n 2 -rs"}, repeats=1))


if __name__ == "__main__":
    main()
