"""Grade each part of an exercise on its own, as a student who did that part and the ones before it, and
nothing after (issue 42): the reference with every TODO of a later part taken from the stub, still raising
its NotImplementedError, graded by the checks of that part (those of an earlier part ran with its own hybrid,
which leaves more to the stub: see run_part). tests/test_parts.py runs it:

    python -m tests.part_runner ex5_paged_kv_cache 5a 5b ...

The parts, in the contract's order, and the TODOs of each are the checker's PARTS table (exercises/test_exN_*.py);
a check belongs to the part its name says (test_5a_..., test_differential_8b_...; test_differential_9bc_ to 9c,
the later one). Prints one line per part, `PART {"part": ..., "returncode": ..., "checks": [...], "failed": {...}}`.
"""

import ast
import importlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from tests.control_support import reference_with, share_one_tokenizer
from workshop.grading import harness
from workshop.grading.harness import CHECK_PART  # noqa: F401 - tests/test_parts.py reads it here

ROOT = Path(__file__).resolve().parents[1]
SEED = 7  # as tests/test_checkers.py: a failure in CI can be replayed


def parts_of(exercise):
    """The checker's PARTS (part -> the stub's TODO names of that part, in the contract's order), or None (one part).
    Read from its source, not imported: tests/test_parts.py asks at collection, before any checker's conftest."""
    tree = ast.parse((ROOT / "exercises" / f"test_{exercise}.py").read_text())
    values = [node.value for node in tree.body if isinstance(node, ast.Assign)
              and [getattr(t, "id", None) for t in node.targets] == ["PARTS"]]
    return ast.literal_eval(values[0]) if values else None


def part_of_check(name, parts):
    """The part a check grades: the one its name says (the later of "9bc"); a check naming none grades the whole exercise."""
    return harness.part_of_check(name) or list(parts)[-1]


def checks_of(exercise):
    return re.findall(r"^def (test_\w+)", (ROOT / "exercises" / f"test_{exercise}.py").read_text(), re.M)


def hybrid(exercise, part, parts):
    """A fresh copy of the reference in which every TODO of a part after `part` is the stub's (its NotImplementedError)."""
    order = list(parts)
    module = reference_with(exercise)
    stub = importlib.import_module(f"exercises.{exercise}")
    for later in order[order.index(part) + 1:]:
        for name in parts[later]:
            owner, _, attr = name.rpartition(".")
            if owner:  # a method: the stub's function object (or property) on the copy's class
                setattr(getattr(module, owner), attr, vars(getattr(stub, owner))[attr])
            else:  # a function: the copy's other functions call it through the copy's globals
                setattr(module, attr, getattr(stub, attr))
    return module


def run_part(exercise, part):
    parts = parts_of(exercise)
    os.environ["WORKSHOP_PART"] = f"{exercise}:{part}"  # tests/part_hybrid.py builds the hybrid from it
    sys.modules.pop("tests.part_hybrid", None)
    order = list(parts)
    # The checks of this part alone: each check of an earlier part k has run with part k's hybrid, which takes more
    # from the stub than this one. A check that passed there called no TODO after k (it would have raised), so it
    # runs the same code here and passes again: running it once per later part would prove nothing more.
    checks = [c for c in checks_of(exercise) if part_of_check(c, parts) == part]
    # A fresh session each time: the checker and its conftest are imported anew, no replacement carries over.
    for name in [n for n in sys.modules if n.startswith(("exercises.test_", "exercises.conftest"))]:
        del sys.modules[name]
    harness.REPLACEMENTS.clear()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.json"
        code = pytest.main([*(f"exercises/test_{exercise}.py::{c}" for c in checks), "-q", "-p", "no:cacheprovider",
                            f"--seed={SEED}", f"--results-json={results}", "--impl=solutions",
                            f"--replace={exercise}=tests.part_hybrid", "-m", "not timing"])
        tests = json.loads(results.read_text())["tests"] if results.exists() else []
    return {"part": part, "returncode": int(code), "checks": [t["name"] for t in tests],
            "failed": {t["name"]: t["output"][-1500:] for t in tests if t["status"] == "failed"}}


def main():
    exercise, parts = sys.argv[1], sys.argv[2:]
    share_one_tokenizer()
    for part in parts:
        print("PART " + json.dumps(run_part(exercise, part)), flush=True)


if __name__ == "__main__":
    main()
