r"""Every promise a stub makes is graded: exercises/contracts/exN_*.md holds one table per exercise, a row
per sentence of every TODO's contract (quoted from the stub) and the checks that grade it. This test keeps
the tables and the stubs in step:

- every sentence of every TODO comment block in the stub is quoted in a row (an edited stub must edit its table);
- every argument with a default of a function with a TODO has a row `argument `name``: a check passes it a
  value other than its default (a function that ignores it must fail);
- every check a row names exists in the exercise's checker; a row that names no check says why
  ("not a promise: ..." for advice on how, which no behaviour can show);
- every promise names, in its last column, the field of the differential check's observation that proves it
  (exercises/test_exN_*.py's observer: what the reference and the student's code are compared on after every call).

A `|` inside a cell is written `\|`, as GitHub's Markdown tables want it.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "exercises" / "contracts"
GRADED = [f"ex{n}_" for n in range(0, 13)]  # every module
STUBS = sorted(p for p in (ROOT / "exercises").glob("ex[0-9]*_*.py")
               if p.name.startswith(tuple(GRADED)) or (CONTRACTS / f"{p.stem}.md").exists())
TODO = re.compile(r"#\s*TODO \(exercise [^)]*\):?")
NOT_A_PROMISE = "not a promise:"


def normalize(text):
    return " ".join(text.replace("`", "").split())


def todo_blocks(source):
    """The text of each TODO comment block: the `# TODO (exercise ...)` line and the comment lines under it."""
    blocks, current = [], None
    for line in source.splitlines():
        stripped = line.strip()
        if TODO.match(stripped):
            current = [TODO.sub("", stripped, count=1)]
            blocks.append(current)
        elif current is not None and stripped.startswith("#"):
            current.append(stripped.lstrip("#"))
        else:
            current = None
    return [normalize(" ".join(block)) for block in blocks]


def sentences(text):
    text = re.sub(r"^\s*-\s+|\s+-\s+(?=[a-zA-Z`])", " \n", text)  # each bullet of a list starts a sentence
    parts = re.split(r"(?<=[.;:!?])\s+(?=[A-Z\"'(])|\n", text)
    return [s.strip(" -") for s in (normalize(p) for p in parts) if len(s.strip(" -")) > 3]


def todo_arguments(source):
    """(function, argument) for every argument with a default of a function whose body raises the TODO."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = ast.get_source_segment(source, node) or ""
        if "NotImplementedError" not in body:
            continue
        args = node.args.args + node.args.kwonlyargs
        defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + node.args.kw_defaults
        found += [(node.name, a.arg) for a, d in zip(args, defaults) if d is not None]
    return found


def table_rows(path):
    rows = []
    for line in path.read_text().splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # \| is a | in a cell
        if line.startswith("|") and len(cells) == 4 and not set(cells[0]) <= set("-: ") and cells[1] != "contract":
            rows.append({"part": cells[0], "contract": normalize(cells[1]), "checks": cells[2], "observed": cells[3]})
    return rows


def checker_tests(stub):
    checker = ROOT / "exercises" / f"test_{stub.stem}.py"
    return set(re.findall(r"^def (test_\w+)", checker.read_text(), re.M))


@pytest.mark.parametrize("stub", STUBS, ids=[s.stem for s in STUBS])
def test_every_todo_sentence_has_a_check(stub):
    table = CONTRACTS / f"{stub.stem}.md"
    assert table.exists(), f"{table.relative_to(ROOT)} is missing: one row per sentence of {stub.name}'s TODOs and the checks that grade it"
    rows, source = table_rows(table), stub.read_text()
    quoted = " \n ".join(r["contract"] for r in rows)
    missing = [s for block in todo_blocks(source) for s in sentences(block) if s not in quoted]
    assert not missing, f"{table.name} quotes none of these sentences of {stub.name}'s TODOs (add a row each, with its checks):\n" + "\n".join(missing)
    arguments = {normalize(r["contract"]).split()[1] for r in rows if r["contract"].startswith("argument ")}
    unlisted = [f"{fn}({arg}=...)" for fn, arg in todo_arguments(source) if arg not in arguments]
    assert not unlisted, f"{table.name} has no row `argument <name>` (a check that passes a non-default value) for {unlisted}"


@pytest.mark.parametrize("stub", STUBS, ids=[s.stem for s in STUBS])
def test_every_named_check_exists(stub):
    table = CONTRACTS / f"{stub.stem}.md"
    if not table.exists():
        pytest.skip(f"{table.name} does not exist yet (test_every_todo_sentence_has_a_check says so)")
    tests, source = checker_tests(stub), normalize(stub.read_text().replace("#", " "))
    for row in table_rows(table):
        assert row["contract"].startswith("argument ") or row["contract"] in source, (
            f"{table.name} quotes a sentence {stub.name} does not say (edited since?): {row['contract']!r}")
        if row["checks"].startswith(NOT_A_PROMISE):
            continue
        named = re.findall(r"`(test_\w+)", row["checks"])
        assert named, f"{table.name}: the row {row['contract'][:60]!r} names no check (or says '{NOT_A_PROMISE} <why>')"
        unknown = [n for n in named if n not in tests]
        assert not unknown, f"{table.name} names checks that exercises/test_{stub.stem}.py does not have: {unknown}"
        assert row["observed"], (f"{table.name}: the row {row['contract'][:60]!r} names no observed field (the last column: what "
                                 f"the differential check compares with the reference's that proves this sentence)")
