"""The checkers are honest: the references pass every check (under the device audit: as on a GPU), the untouched stubs fail every check
because of their own exercise's NotImplementedError, and plausible wrong implementations (the
negative controls in tests/controls/) are each caught, and different correct designs (tests/alternatives/)
pass. Stubs and references share their public API.

Each case runs a checker in a fresh pytest process, exactly as a student would, and reads the
Gradescope results.json it writes; the negative controls of one exercise share one process (a fresh
pytest session each, tests/control_runner.py), which saves importing torch once per control.

Every push (CI) runs the references' checks that are not timings; `--full` (tests/conftest.py) adds the long
proofs: the references' timing checks, the stubs, the controls and the alternatives.
"""

import ast
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.alternatives
import tests.controls

ROOT = Path(__file__).resolve().parents[1]
SEED = 7  # fixed here so that a failure in CI can be replayed; students get a new seed every run
EXERCISES = sorted(p.stem.removeprefix("test_") for p in (ROOT / "exercises").glob("test_ex*.py"))
CONTROLS = sorted(m.name for m in pkgutil.iter_modules(tests.controls.__path__))
ALTERNATIVES = sorted(m.name for m in pkgutil.iter_modules(tests.alternatives.__path__))


def run_checker(exercise, tmp_path, *args):
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", f"exercises/test_{exercise}.py", "-q", "-p", "no:cacheprovider",
                           f"--seed={SEED}", f"--results-json={results}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if not results.exists() and proc.returncode == 0 and "skipped" in last and "passed" not in last:
        return proc, {"tests": []}  # every selected check skipped (exercise 11's timing needs CUDA): nothing scored
    assert results.exists(), f"the checker wrote no results (exit code {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads(results.read_text())


def exercise_number(exercise):
    return int(re.match(r"ex(\d+)_", exercise).group(1))


def assert_references_pass(exercise, tmp_path, marks):
    proc, results = run_checker(exercise, tmp_path, "--impl=solutions", "-rs", "--device-audit", "-m", marks)
    failed = [t["name"] for t in results["tests"] if t["status"] != "passed"]
    assert proc.returncode == 0 and not failed, f"the references fail {failed}:\n{proc.stdout[-6000:]}"
    # A check skips only for want of CUDA (exercise 11's real graphs and their timing), and only where there is none.
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skips if "CUDA" not in line or torch.cuda.is_available()]
    assert not unexpected, f"checks were skipped:\n{proc.stdout[-3000:]}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_references_pass_every_check(exercise, tmp_path):
    """... and would on a GPU: --device-audit fails a tensor made on the default device that meets the model's
    (workshop/grading/device_audit.py), the bug a CPU cannot otherwise show. The timing checks and the statistical
    ones over thousands of draws (marked slow): below, with --full."""
    assert_references_pass(exercise, tmp_path, "not timing and not slow")


SLOW = [e for e in EXERCISES if "mark.slow" in (ROOT / "exercises" / f"test_{e}.py").read_text()]


@pytest.mark.full
@pytest.mark.parametrize("exercise", SLOW)
def test_references_pass_the_slow_checks(exercise, tmp_path):
    assert_references_pass(exercise, tmp_path, "slow and not timing")


TIMED = [e for e in EXERCISES if "mark.timing" in (ROOT / "exercises" / f"test_{e}.py").read_text()]


@pytest.mark.full
@pytest.mark.parametrize("exercise", TIMED)
def test_references_pass_the_timing_checks(exercise, tmp_path):
    assert_references_pass(exercise, tmp_path, "timing")


def edited_stubs(exercise):
    """The stub files of `exercise` that differ from the committed ones (a student at work), per git."""
    stubs = [f"exercises/{exercise}.py"]
    proc = subprocess.run(["git", "diff", "--name-only", "HEAD", "--", *stubs], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


STUDENT_AT_WORK = ("this is the maintainers' suite: it checks that the untouched stubs fail. If you are solving the exercise, "
                   "that is expected; grade yourself with `pytest exercises/`.")


@pytest.mark.full
@pytest.mark.parametrize("exercise", EXERCISES)
def test_untouched_stubs_fail_every_check(exercise, tmp_path):
    if edited_stubs(exercise):
        pytest.skip(f"{', '.join(edited_stubs(exercise))} differs from the committed stub: {STUDENT_AT_WORK}")
    proc, results = run_checker(exercise, tmp_path, "--impl=exercises", "-m", "not timing")
    assert proc.returncode == 1, f"expected plain test failures (exit code 1), got {proc.returncode}:\n{proc.stdout[-3000:]}"
    own_todo = f"Exercise {exercise_number(exercise)}:"
    for test in results["tests"]:
        assert test["status"] == "failed", (f"{test['name']} passes on the stub exercises/{exercise}.py: it checks nothing the "
                                            f"student writes (or the stub was solved and committed: {STUDENT_AT_WORK})")
        assert "Not implemented yet" in test["output"] and own_todo in test["output"], (
            f"{test['name']} fails on the stub for another reason than its exercise's TODO:\n{test['output'][-2000:]}")


def controls_of(exercise):
    return [c for c in CONTROLS if importlib.import_module(f"tests.controls.{c}").EXERCISE == exercise]


@pytest.mark.full
@pytest.mark.parametrize("exercise", [e for e in EXERCISES if controls_of(e)])
def test_negative_controls_are_caught(exercise):
    """Every control of the exercise makes its checker fail, for its bug and not for a missing TODO. The
    controls of one exercise run in one process (tests/control_runner.py: a fresh pytest session each)."""
    controls = controls_of(exercise)
    proc = subprocess.run([sys.executable, "-m", "tests.control_runner", exercise, *controls], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    results = {r["control"]: r for r in (json.loads(line[len("CONTROL "):]) for line in proc.stdout.splitlines()
                                         if line.startswith("CONTROL "))}
    assert set(results) == set(controls), f"the runner reported {sorted(results)} of {controls}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    docs = {c: importlib.import_module(f"tests.controls.{c}").__doc__.strip() for c in controls}
    missed = [f"{c} ({docs[c]})" for c, r in results.items() if r["returncode"] != 1 or not r["failed"]]
    assert not missed, f"not caught: {missed}"
    todo = {c: r["todo"] for c, r in results.items() if r["todo"]}
    assert not todo, f"failed for a missing TODO rather than for their bug: {todo}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_stubs_and_references_share_their_api(exercise):
    stub, ref = (importlib.import_module(f"{package}.{exercise}") for package in ("exercises", "solutions"))

    def public_api(module):
        api = {}
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if not callable(obj):  # a constant made of the module's own class (GREEDY = SamplingParams(...)): its value
                api[name] = repr(obj)
                continue
            try:
                api[name] = str(inspect.signature(obj))
            except ValueError:  # an exception class: no signature of its own
                api[name] = f"subclass of {obj.__mro__[1].__name__}"
            for method, fn in inspect.getmembers(obj, inspect.isfunction) if inspect.isclass(obj) else []:
                if not method.startswith("_") or method in ("__init__", "__len__"):
                    api[f"{name}.{method}"] = str(inspect.signature(fn))
        return api

    assert public_api(stub) == public_api(ref)


MODULES = sorted(f"{package}/{path.name}" for package in ("exercises", "solutions")
                 for path in (ROOT / package).glob("ex[0-9]*_*.py") if not path.name.startswith("test_"))


@pytest.mark.parametrize("path", MODULES)
def test_no_exercise_imports_a_later_reference(path):
    """A student stuck on exercise N can do exercise N+1, and exercise N never hands out the answer of a
    later one (or its own): stubs and references import only the references of EARLIER exercises (the
    engines sample with workshop.serving.sampling, given code, not exercise 6's answer)."""
    number = exercise_number(Path(path).name)
    later = []
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{alias.name}" for alias in node.names] if isinstance(node, ast.ImportFrom) and node.module else [])
        for name in names:
            match = re.match(r"solutions\.ex(\d+)_", name)
            if match and int(match[1]) >= number:
                later.append(name.rsplit(".", 1)[0] if isinstance(node, ast.ImportFrom) else name)
    assert not later, (f"{path} imports {sorted(set(later))}: the reference of exercise {number} or a later one. Import only "
                       f"references of earlier exercises, or given code (workshop/, e.g. workshop.serving.sampling).")


@pytest.mark.full
@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_alternative_design_passes(alternative, tmp_path):
    """A different correct design (tests/alternatives/) passes every check: the checkers grade behaviour."""
    module = importlib.import_module(f"tests.alternatives.{alternative}")
    part = ["-k", module.PART] if hasattr(module, "PART") else []  # an alternative of one part: that part's checks
    proc, results = run_checker(module.EXERCISE, tmp_path, "--impl=solutions", f"--replace={module.EXERCISE}=tests.alternatives.{alternative}",
                                "-m", "not timing", *part)
    failed = [t["name"] for t in results["tests"] if t["status"] != "passed"]
    assert proc.returncode == 0 and not failed, f"{alternative} ({module.__doc__.strip()}) fails {failed}:\n{proc.stdout[-3000:]}"
