"""Mutation testing of the references: does each checker fail a reference with one small bug in it?

cosmic-ray makes the mutants (one operator applied at one place: `+` for `-`, `<` for `<=`, a constant
changed, a `break` for a `continue`, ...). Only the code of the exercise's TODO parts is mutated: the
functions the stub leaves for the student; the given code around them is the same in stub and reference
and is not what the checker grades. Each mutant is handed in as a student's exercises/exN_*.py and graded by
the exercise's checker as a student is (`pytest exercises/test_exN_*.py`: the checker compares with the
unmutated reference), in a private copy of the repository, so the working tree is never touched. A mutant the checker fails is killed; one it passes survived: either it is
equivalent (no input can tell it apart; exercises/contracts/equivalent_mutants.toml says why, in one line)
or a check is missing.
"""

import ast
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from cosmic_ray import plugins
from cosmic_ray.commands.init import init
from cosmic_ray.mutating import mutate_code
from cosmic_ray.work_db import WorkDB

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENTS = ROOT / "exercises" / "contracts" / "equivalent_mutants.toml"
SEED = 7  # the checker's seed: a surviving mutant can be replayed


@dataclass(frozen=True)
class Mutant:
    exercise: str
    operator: str
    occurrence: int
    line: int  # 1-based, in solutions/<exercise>.py
    function: str
    before: str  # the line as written
    after: str  # the line as mutated

    @property
    def key(self):
        return f"{self.operator}#{self.occurrence}"

    def describe(self):
        return f"solutions/{self.exercise}.py:{self.line} in {self.function}: `{self.before}` -> `{self.after}`"


def todo_functions(exercise):
    """Name -> (first line, last line) in the reference of every function the stub leaves as a TODO
    (its body raises NotImplementedError), methods as Class.method."""
    def spans(path):
        tree, found = ast.parse(path.read_text()), {}
        for node in tree.body:
            defs = [(node.name, node)] if isinstance(node, ast.FunctionDef) else (
                [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.FunctionDef)] if isinstance(node, ast.ClassDef) else [])
            for name, fn in defs:
                found[name] = (fn, (fn.lineno, fn.end_lineno))
        return found

    stub, ref = spans(ROOT / "exercises" / f"{exercise}.py"), spans(ROOT / "solutions" / f"{exercise}.py")
    todo = [name for name, (fn, _) in stub.items() if any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
                                                         for n in ast.walk(fn))]
    return {name: ref[name][1] for name in todo if name in ref}


def mutants(exercise):
    """Every mutant cosmic-ray's core operators make of the exercise's TODO functions in the reference."""
    path = ROOT / "solutions" / f"{exercise}.py"
    source, functions = path.read_text(), todo_functions(exercise)
    lines = source.splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        db = WorkDB(Path(tmp) / "session.sqlite", WorkDB.Mode.create)
        try:
            init([path], db, {})
            specs = [item.mutations[0] for item in db.work_items]
        finally:
            db.close()
    found = []
    for spec in specs:
        line = spec.start_pos[0]
        function = next((name for name, (a, b) in functions.items() if a <= line <= b), None)
        if function is None:
            continue
        operator = plugins.get_operator(spec.operator_name)(**spec.operator_args)
        mutated = mutate_code(source, operator, spec.occurrence)
        if mutated is None:
            continue
        after = mutated.splitlines()
        changed = next((i for i, (a, b) in enumerate(zip(lines, after)) if a != b), line - 1)
        found.append(Mutant(exercise, spec.operator_name, spec.occurrence, changed + 1, function,
                            lines[changed].strip(), after[changed].strip() if changed < len(after) else ""))
    return found


def mutated_source(mutant):
    operator = plugins.get_operator(mutant.operator)()
    return mutate_code((ROOT / "solutions" / f"{mutant.exercise}.py").read_text(), operator, mutant.occurrence)


def equivalents():
    """(exercise, before, after) -> why no input can tell the mutant from the reference."""
    if not EQUIVALENTS.exists():
        return {}
    data = tomllib.loads(EQUIVALENTS.read_text())
    return {(exercise, e["before"], e["after"]): e["why"] for exercise, entries in data.items() for e in entries}


class Sandbox:
    """A private copy of the repository where one reference at a time is mutated and graded."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mutation-"))
        shutil.copytree(ROOT, self.dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", "*.egg-info", ".venv", "node_modules", ".pytest_cache"))

    def grade(self, exercise, source, timeout_s, extra=()):
        """Run the exercise's checker on `source` handed in as a student's exercises/<exercise>.py (the checker's
        own reference stays the unmutated one, as for a student): (killed, seconds, the end of pytest's output)."""
        path = self.dir / "exercises" / f"{exercise}.py"
        original = path.read_text()
        path.write_text(source)
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", f"exercises/test_{exercise}.py", "--impl=exercises", "-x", "-q",
                                   "-p", "no:cacheprovider", f"--seed={SEED}", "-m", "not timing", *extra],
                                  cwd=self.dir, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PYTHONPATH": str(self.dir), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"})
            killed, output = proc.returncode != 0, proc.stdout[-1500:]
        except subprocess.TimeoutExpired:
            killed, output = True, f"timed out after {timeout_s:.0f} s (an endless loop counts as caught)"
        finally:
            path.write_text(original)
        return killed, time.perf_counter() - start, output

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def sample(found, size, seed):
    """A seeded sample of `size` mutants (all of them when size is 0 or at least their number)."""
    if not size or size >= len(found):
        return list(found)
    return sorted(random.Random(seed).sample(found, size), key=lambda m: (m.line, m.key))


def wilson_interval(killed, n, z=1.96):
    """95% interval of the kill rate of all mutants when `killed` of `n` sampled ones were killed."""
    if n == 0:
        return (0.0, 1.0)
    p = killed / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
