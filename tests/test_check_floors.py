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
