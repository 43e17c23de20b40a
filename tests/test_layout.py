"""The repository's architecture stays visible: the shared library's parts are named in its docstrings,
no module of it imports in a circle, entry points only call the library, and nothing edits sys.path."""

import ast
import re
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "workshop"


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, known):
    """The library modules a file imports (at any depth: a function's own import counts too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def library_graph():
    files = {module_name(p): p for p in LIBRARY.rglob("*.py")}
    return {name: imported_modules(path, files) - {name} for name, path in files.items()}


def test_no_library_module_imports_in_a_circle():
    graph = library_graph()
    # A package's __init__ may gather its own modules; only its modules' imports of each other count.
    edges = {m: {d for d in deps if not (m == d.rpartition(".")[0])} for m, deps in graph.items()}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "library modules import each other in a circle: " + "; ".join(" -> ".join(c) for c in cycles)


def test_every_part_of_the_library_is_named_in_its_package_docstring():
    for package in [LIBRARY, *[p for p in LIBRARY.iterdir() if (p / "__init__.py").exists()]]:
        doc = importlib.import_module(module_name(package / "__init__.py")).__doc__ or ""
        parts = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
        parts += [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        missing = [part for part in parts if part not in doc]
        assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not say what {missing} hold: name them in its docstring."


@pytest.mark.parametrize("folder", ["scripts", "bench"])
def test_entry_points_are_never_imported(folder):
    entry_points = {p.stem for p in (ROOT / folder).glob("*.py")}
    importers = []
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or "site-packages" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == folder:
                importers.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == folder for a in node.names):
                importers.append(str(path.relative_to(ROOT)))
    assert entry_points and not importers, f"{folder}/ holds entry points only, but {importers} import from it: move the code into workshop/."


def test_no_file_edits_sys_path():
    edits = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
             if ".venv" not in p.parts and p.name != "test_layout.py" and "sys.path." in p.read_text()]
    assert not edits, f"{edits} edit sys.path: the editable install (pip install -e .) makes everything importable."


def test_one_name_per_module():
    """A module's deck and notebook share one name (slides/05_paged_kv_cache.md, notebooks/05_paged_kv_cache.ipynb),
    and it is the name of one of its exercises (exercises/ex5_paged_kv_cache.py)."""
    decks = {p.stem for p in (ROOT / "slides").glob("[0-9][0-9]_*.md")}
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert decks == notebooks, f"decks without a notebook of the same name: {sorted(decks - notebooks)}; notebooks without a deck: {sorted(notebooks - decks)}"
    exercises = {re.sub(r"^ex(\d+)_", lambda m: f"{int(m[1]):02d}_", p.stem) for p in (ROOT / "exercises").glob("ex[0-9]*_*.py")}
    assert decks <= exercises, f"modules named otherwise than any of their exercises: {sorted(decks - exercises)}"
