"""Every notebook in notebooks/ runs headless from top to bottom on the embedded model, with the
reference solutions (WORKSHOP_IMPL=solutions), as an instructor would run it live.

Notebooks are found by globbing, so a new one (03_..., 04_...) is tested without touching this file.
The kernel is this interpreter: a throw-away kernelspec named python3 points at sys.executable, so
a python3 kernelspec of the user's or the system's (another Python, without torch) is never picked up.
"""

import json
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
