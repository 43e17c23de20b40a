"""Every notebook in notebooks/ runs headless from top to bottom on the embedded model, with the
reference solutions (WORKSHOP_IMPL=solutions), as an instructor would run it live.

Notebooks are found by globbing, so a new one (03_..., 04_...) is tested without touching this file.
The kernel is this interpreter: a throw-away kernelspec named python3 points at sys.executable, so
a python3 kernelspec of the user's or the system's (another Python, without torch) is never picked up.
"""

import json
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(1200)  # a whole notebook; each takes well under a minute on 2 cores


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """Make the kernel name "python3" resolve to this interpreter (JUPYTER_PATH is searched first)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (workshop tests)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("WORKSHOP_IMPL", "solutions")  # the kernel inherits this process's environment
    return "python3"


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.full
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, this_python_kernel):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=this_python_kernel, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(path.parent)}})  # cwd: notebooks/, as in Jupyter
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"{path.name} failed (WORKSHOP_IMPL=solutions):\n{error}", pytrace=False)
    print(f"{path.name}: executed in {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{path.name}: a cell reported an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"



@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_saved_without_outputs(path):
    """Committed notebooks carry no outputs: clean diffs, and what students see is what their run produces."""
    nb = nbformat.read(path, as_version=4)
    with_outputs = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not with_outputs, (f"{path.name}: cells {with_outputs} were saved with outputs; clear them with "
                              f"`jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}`.")


# ----------------------------------------------------------------------------------------------
# Answers stay out of sight: reference code only under a solution walkthrough, after "Your turn"

YOUR_TURN = re.compile(r"^#+\s.*\byour turn\b", re.I | re.M)
WALKTHROUGH = re.compile(r"^#+ .*solution walkthrough", re.I)
PRINTS_CODE = [  # ways a code cell prints a function's source (the reference's, as the notebooks run it)
    (re.compile(r"\bgetsource(lines)?\s*\("), "inspect.getsource"),
    (re.compile(r"^\s*%(psource|pfile|load|cat)\b", re.M), "an IPython magic that prints source"),
    (re.compile(r"^[^#\n]*\?\?\s*$", re.M), "`??`"),
    (re.compile(r"solutions[/\\]\w+\.py"), "a solutions/*.py file's text"),
]
READS_FILE = re.compile(r"\bread_text\s*\(|\bopen\s*\(|\breadlines\s*\(|^\s*!\s*(cat|head|tail|less|more)\b", re.M)
SOLUTIONS_PATH = re.compile(r"""solutions\s*["']?\s*/|/\s*["']solutions\b|\bsolutions\.__file__|__file__""")


def code_printing_cells(cells):
    """(cell index, what) of every code cell that prints source code."""
    found = []
    for index, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith("#"))
        hits = [what for pattern, what in PRINTS_CODE if pattern.search(source)]
        if READS_FILE.search(source) and SOLUTIONS_PATH.search(source):
            hits.append("a file of solutions/ read as text")
        found += [(index, what) for what in hits[:1]]
    return found


def solution_section_start(cells):
    """The index of the first markdown cell from which code may be shown: the first heading that names
    the solution walkthrough, after a markdown cell with a "Your turn" heading (the same cell counts when
    its walkthrough heading comes below the Your turn one). None when the notebook has no such section."""
    your_turn_seen = False
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if YOUR_TURN.match(line):
                your_turn_seen = True
            elif your_turn_seen and WALKTHROUGH.match(line):
                return index
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_reference_code_only_in_the_solution_walkthrough(path):
    """A notebook is taught before the student writes the exercise: the lesson uses the engine as a black
    box (figures, state, outputs), and code of a TODO part is printed only in a final section whose
    heading names the solution walkthrough, after the "Your turn" cell that says which file to open."""
    cells = nbformat.read(path, as_version=4).cells
    start = solution_section_start(cells)
    early = [(index, what) for index, what in code_printing_cells(cells) if start is None or index < start]
    where = (f"the first heading matching '{WALKTHROUGH.pattern}' after the '## Your turn' cell is in cell {start}" if start is not None
             else "it has no heading matching '## Solution walkthrough...' after a '## Your turn' cell")
    assert not early, (
        f"{path.name}: cells {[i for i, _ in early]} print source code ({', '.join(sorted({w for _, w in early}))}) before the "
        f"solution walkthrough ({where}). Move them to the end, under a markdown heading such as '## Solution walkthrough: "
        f"<the part>' that comes after the '## Your turn' cell; the lesson before it uses the engine as a black box.")
