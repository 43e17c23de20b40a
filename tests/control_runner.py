"""Run the negative controls of one exercise in one process: each one a fresh pytest session of the
exercise's checker with the control in place of the module under test, exactly the command a student
would type with --replace, but with torch imported once for all of them (a process per control spent
most of its time importing torch). tests/test_checkers.py runs it:

    python -m tests.control_runner ex2_kv_cache ex2_never_appends ex2_upper_left_mask ...
    CONTROL_SEED=23 python -m tests.control_runner ex2_kv_cache ...   # another seed (scripts/control_sweep.py)

Prints one line per control, `CONTROL {"control": ..., "returncode": ..., "failed": [...], "todo": [...]}`:
the checks that failed, and those that failed for a missing TODO instead of the control's bug.
"""

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests.control_support import share_one_tokenizer
from workshop.grading import harness

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("CONTROL_SEED", 7))  # 7 in CI (tests/test_checkers.py): a failure there can be replayed


def run_control(exercise, control):
    module = importlib.import_module(f"tests.controls.{control}")
    timing = "timing" if getattr(module, "CAUGHT_BY_TIMING", False) else "not timing"
    part = ["-k", module.PART] if hasattr(module, "PART") else []  # only the check that catches it: quicker
    # A fresh session each time: the checker and its conftest are imported anew, no replacement carries over.
    for name in [n for n in sys.modules if n.startswith(("exercises.test_", "exercises.conftest"))]:
        del sys.modules[name]
    harness.REPLACEMENTS.clear()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.json"
        code = pytest.main([f"exercises/test_{exercise}.py", "-q", "-p", "no:cacheprovider", f"--seed={SEED}",
                            f"--results-json={results}", "--impl=solutions", f"--replace={exercise}=tests.controls.{control}",
                            "-m", timing, "-x", *part])  # the first failed check is enough
        tests = json.loads(results.read_text())["tests"] if results.exists() else []
    return {"control": control, "returncode": int(code), "failed": [t["name"] for t in tests if t["status"] == "failed"],
            "todo": [t["name"] for t in tests if "Not implemented yet" in t["output"]]}


def main():
    exercise, controls = sys.argv[1], sys.argv[2:]
    share_one_tokenizer()
    for control in controls:
        print("CONTROL " + json.dumps(run_control(exercise, control)), flush=True)


if __name__ == "__main__":
    main()
