"""Each part of an exercise is graded on its own (issue 42): a student who did part N and the parts before it, and
nothing after, passes every check of those parts (`pytest exercises/test_ex5_paged_kv_cache.py -k 5a` included). Each
checker declares its parts in PARTS (part -> the stub's TODOs it starts, in the contract's order); the checks of a
part are those its name says (test_5a_..., test_differential_8b_...).

The proof (--full): for each part N but the last, the reference with every TODO of a later part taken from the stub
(still raising its NotImplementedError) passes every check of part N (tests/part_runner.py). With the parts before N it
passes theirs too: each of those passed with even more taken from the stub, so it calls no TODO after its own part, and
runs the same code with part N's hybrid. The last part's is the reference itself: test_checkers.py's
test_references_pass_every_check.
"""

import ast
import json
import re
import subprocess
import sys

import pytest

from tests.part_runner import CHECK_PART, ROOT, checks_of, part_of_check, parts_of

EXERCISES = sorted(p.stem.removeprefix("test_") for p in (ROOT / "exercises").glob("test_ex*.py"))


def todos(exercise):
    """The stub's functions and methods ("Class.method") whose body raises NotImplementedError: its TODOs."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef) and any(
                    isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and getattr(n.exc.func, "id", None) == "NotImplementedError"
                    for n in ast.walk(child)):
                found.append(prefix + child.name)
    visit(ast.parse((ROOT / "exercises" / f"{exercise}.py").read_text()), "")
    return found


@pytest.mark.parametrize("exercise", EXERCISES)
def test_parts_name_every_todo_and_every_check(exercise):
    parts, checks = parts_of(exercise), checks_of(exercise)
    if parts is None:  # one part: no check may name a part (the whole checker grades the whole exercise)
        lettered = [c for c in checks if CHECK_PART.match(c)]
        assert not lettered, f"exercises/test_{exercise}.py has checks of lettered parts {lettered} but declares no PARTS"
        return
    declared = [name for names in parts.values() for name in names]
    assert sorted(declared) == sorted(todos(exercise)), (
        f"exercises/test_{exercise}.py's PARTS must name each TODO of exercises/{exercise}.py once: it names {sorted(declared)}, "
        f"the stub's TODOs are {sorted(todos(exercise))}")
    unknown = {c: part_of_check(c, parts) for c in checks if part_of_check(c, parts) not in parts}
    assert not unknown, f"checks of parts PARTS does not declare: {unknown}"
    empty = [p for p in parts if not any(part_of_check(c, parts) == p for c in checks)]
    assert not empty, f"parts without a check of their own: {empty}"
    # `pytest -k 9b` selects every check whose name holds "9b": each must be a check of that part (9bc is 9c's).
    for part in parts:
        selected = [c for c in checks if re.search(rf"(?<![0-9]){part}", c)]
        later = [c for c in selected if part_of_check(c, parts) != part]
        assert not later, f"-k {part} selects {later}, checks of another part: name each check after the one part it grades"


PARTS = [(e, p) for e in EXERCISES if parts_of(e) for p in list(parts_of(e))[:-1]]


@pytest.mark.full
@pytest.mark.parametrize("exercise, part", PARTS, ids=[p for _, p in PARTS])
def test_each_part_is_graded_alone(exercise, part):
    """The reference with the later parts' TODOs from the stub passes every check of this part (and so of the parts
    before it: see the module's docstring)."""
    proc = subprocess.run([sys.executable, "-m", "tests.part_runner", exercise, part], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    lines = [json.loads(line[len("PART "):]) for line in proc.stdout.splitlines() if line.startswith("PART ")]
    assert lines, f"the runner reported nothing:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = lines[0]
    assert result["checks"], f"no check of part {part} ran:\n{proc.stdout[-3000:]}"
    failed = "\n".join(f"{name}: {output[-600:]}" for name, output in result["failed"].items())
    assert result["returncode"] == 0 and not failed, (
        f"with the TODOs after part {part} left undone, checks of part {part} fail (they call a later part):\n{failed}")
