"""scripts/check_floors.py, cheaply: every dependency declares a lower bound (without one, its
--resolution lowest-direct install would take the package's oldest release), and the script lists its
smoke tests. The check itself installs a venv and takes minutes: run it by hand (results/floors.json)."""

import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_dependency_has_a_lower_bound():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    unbounded = [d for d in declared if not any(s.operator in (">=", "==", "~=") for s in Requirement(d).specifier)]
    assert not unbounded, f"give these a lower bound the code runs with (check it with scripts/check_floors.py): {unbounded}"


def test_check_floors_lists_its_smoke_tests():
    out = subprocess.run([sys.executable, "scripts/check_floors.py", "--list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert {"imports", "checkers", "serving-bench"} <= set(names), out


def test_the_floor_torch_has_run_the_checkers():
    """The floor pyproject.toml names for torch is one that has run: results/floors.json (written by
    scripts/check_floors.py --save) installed exactly that torch and its checkers' quick tier passed there. A
    floor raised or lowered without a new run fails here (issue 40: 2.11's Generator took no weak reference,
    which only a run on 2.11 could show)."""
    import json

    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_floor = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch")
    floor = next(s.version for s in torch_floor.specifier if s.operator == ">=")
    data = json.loads((ROOT / "results" / "floors.json").read_text())["data"]
    ran = Version(Version(data["direct"]["torch"]["resolved"]).public)
    assert ran == Version(floor), f"results/floors.json ran torch {ran}, the floor is {floor}: run python scripts/check_floors.py --save"
    assert data["smoke"]["checkers"]["passed"], f"the checkers failed on torch {ran}: {data['smoke']['checkers']['summary']}"
    assert data["passed"], {name: row["summary"] for name, row in data["smoke"].items() if not row["passed"]}
