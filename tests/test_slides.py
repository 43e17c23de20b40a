"""Decks an instructor can project: every figure there, sharp (>= 200 dpi) and legible (>= 12 pt as
shown), and no reference code of an exercise's TODO parts before the deck's solution walkthrough."""

import ast
import json
import re
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SLIDES = ROOT / "slides"
DECKS = sorted(SLIDES.glob("[0-9][0-9]_*.md"))
FIGURES = sorted((SLIDES / "figures").glob("*.png"))
IMAGE = re.compile(r"!\[(?P<size>[^\]]*)\]\((?P<path>[^)\s]+)\)")
WALKTHROUGH = re.compile(r"^#+ .*solution walkthrough", re.I | re.M)
SLIDE_PX_PER_INCH = 96  # a 1280 x 720 px slide is 13.33 x 7.5 in
MIN_PT = 12


def images(deck):
    return [(m["size"], m["path"]) for m in IMAGE.finditer(deck.read_text())]


@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_every_image_a_deck_shows_exists(deck):
    missing = [path for _, path in images(deck) if not (deck.parent / path).exists()]
    assert not missing, f"{deck.name} shows images that do not exist: {missing} (python scripts/make_figures.py draws them)"


@pytest.mark.parametrize("png", FIGURES, ids=[p.name for p in FIGURES])
def test_figures_are_saved_at_200_dpi_or_more(png):
    dpi = Image.open(png).info.get("dpi", (0, 0))
    assert min(dpi) >= 199.5, f"{png.name} is saved at {dpi} dpi: projected, it blurs. Save it with dpi >= 200."


@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_figure_text_is_12_pt_or_more_as_shown(deck):
    """make_figures records each figure's drawn size and smallest font in results/figures.json; the
    deck's ![w:N] (or h:N) says how large it is shown: the font scales by shown / drawn size."""
    drawn = json.loads((ROOT / "results" / "figures.json").read_text())["data"]["figures"]
    small = []
    for size, path in images(deck):
        fig = drawn.get(Path(path).name)
        if fig is None:
            continue
        m = re.search(r"\b([wh]):(\d+)", size)
        if not m:
            small.append(f"{path}: no w:/h: size, so Marp scales it to fit; give the size it is drawn for")
            continue
        shown_in = int(m[2]) / SLIDE_PX_PER_INCH
        scale = shown_in / (fig["width_in"] if m[1] == "w" else fig["height_in"])
        if fig["smallest_font_pt"] * scale < MIN_PT - 0.05:
            small.append(f"{path}: smallest text {fig['smallest_font_pt']:.1f} pt drawn, {fig['smallest_font_pt'] * scale:.1f} pt shown")
    assert not small, f"{deck.name}: figure text below {MIN_PT} pt on the slide: {small}"


def todo_parts():
    """{exercise stem: [(name, solution source lines)]} for every function or method that the
    exercise's stub leaves to the student (its body raises NotImplementedError)."""
    parts = {}
    for stub in sorted((ROOT / "exercises").glob("ex[0-9]*_*.py")):
        solution = ROOT / "solutions" / stub.name
        if not solution.exists():
            continue
        todo = {name for name, node in _functions(stub) if any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
                                                                for n in ast.walk(node))}
        given = {_code(line) for line in stub.read_text().splitlines()}
        source = solution.read_text().splitlines()
        for name, node in _functions(solution):
            if name in todo:
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = [_code(line) for n in body for line in source[n.lineno - 1:n.end_lineno]]
                parts.setdefault(stub.stem, []).append((name, [line for line in lines if len(line) >= 16 and line not in given]))
    return parts


def _functions(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _code(line):
    """A line of code without indentation and trailing comment."""
    return re.sub(r"\s+#.*$", "", line).strip()


@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_no_solution_code_before_the_walkthrough(deck):
    text = deck.read_text()
    walkthrough = WALKTHROUGH.search(text)
    before = text[:walkthrough.start()] if walkthrough else text
    shown = {_code(line) for block in re.findall(r"```[^\n]*\n(.*?)```", before, re.S) for line in block.splitlines()}
    leaked = [f"{stem}: {name}: {line}" for stem, parts in todo_parts().items() for name, lines in parts
              for line in lines if line in shown]
    assert not leaked, (f"{deck.name} shows reference code of exercise TODO parts before its '## Solution walkthrough' "
                        f"heading (move it after the exercise slide): {leaked[:8]}")


def test_the_todo_parts_are_found():
    parts = todo_parts()
    assert {"ex1_generate", "ex2_kv_cache", "ex3_static_batching", "ex4_continuous_batching"} <= set(parts)
    assert all(lines for stem in parts for _, lines in parts[stem]), "a TODO part without code lines: the leak check would be blind"


@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_no_line_starts_with_a_number_marker(deck):
    """Markdown reads a line that starts with an HTML comment as an HTML block, so Marp drops the whole
    line, number and text around it: a marker must come after some text on its line."""
    lines = [i + 1 for i, line in enumerate(deck.read_text().splitlines()) if line.lstrip().startswith("<!--r:")]
    assert not lines, f"{deck.name}: lines {lines} start with a <!--r:...--> marker, which Marp does not show: put words before it."


# ----------------------------------------------------------------------------------------------
# Figures drawn from results files are redrawn when those files are re-measured

DECKS_FIGURES = ROOT / "workshop" / "figures" / "decks.py"  # the figure functions (scripts/make_figures.py calls them)


def figure_sources():
    """{figure file: (module, {results names its function reads})}, read from workshop/figures/decks.py:
    the drawn_from("name") calls in a figure function, in the module functions it calls and in the
    Context properties it uses (ctx.cost), followed to any depth."""
    tree = ast.parse(DECKS_FIGURES.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    context = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Context"), None)
    members = {item.name: item for item in (context.body if context else []) if isinstance(item, ast.FunctionDef)}

    def reads(node, seen):
        found = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                if n.func.id == "drawn_from" and n.args and isinstance(n.args[0], ast.Constant):
                    found.add(n.args[0].value)
                elif n.func.id in functions and n.func.id not in seen:
                    found |= reads(functions[n.func.id], seen | {n.func.id})
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("ctx", "self"):
                if n.attr in members and f"Context.{n.attr}" not in seen:
                    found |= reads(members[n.attr], seen | {f"Context.{n.attr}"})
        return found

    sources = {}
    for node in functions.values():
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "figure":
                module, filename = (ast.literal_eval(arg) for arg in decorator.args)
                sources[filename] = (module, reads(node, {node.name}))
    return sources


def test_figures_read_results_only_through_drawn_from():
    """A figure function that called results.load would draw from a file without recording it."""
    tree = ast.parse(DECKS_FIGURES.read_text())
    allowed = {"drawn_from", "draw", "_save_merged"}  # drawn_from itself; draw and _save_merged read figures.json
    direct = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name not in allowed
              for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == "results.load"]
    assert not direct, (f"workshop/figures/decks.py: {sorted(set(direct))} call results.load(): read a results file with "
                        f"drawn_from(name) instead, so that results/figures.json records what each figure was drawn from.")
    assert figure_sources(), "no @figure functions found in workshop/figures/decks.py: the provenance check would be blind"


def test_no_figure_drawn_from_older_results_than_its_file_holds():
    """Each figure drawn from a results file records that file's date and a digest of the data it used
    (results/figures.json, written by make_figures); a file re-measured since then makes the figure stale."""
    import workshop.results as results

    drawn = json.loads((ROOT / "results" / "figures.json").read_text())["data"]["figures"]
    problems = []
    for filename, (module, names) in sorted(figure_sources().items()):
        entry = drawn.get(filename)
        redraw = f"python scripts/make_figures.py --only {filename}"
        if entry is None:
            continue  # never drawn: test_every_image_a_deck_shows_exists says so where a deck needs it
        recorded = entry.get("drawn_from")
        if recorded is None:
            if names:
                problems.append(f"{filename} (module {module}) reads {sorted(names)} but records no sources: it was drawn "
                                f"before figures recorded them; redraw it: {redraw}")
            continue
        missing = {f"results/{name}.json" for name in names} - {s["file"] for s in recorded}
        if missing:
            problems.append(f"{filename} reads {sorted(missing)} but figures.json does not record it; redraw it: {redraw}")
        for source in recorded:
            name = Path(source["file"]).stem
            try:
                record = results.load(name)
            except FileNotFoundError:
                problems.append(f"{filename} was drawn from {source['file']}, which no longer exists")
                continue
            if results.digest(record, source.get("part")) != source["digest"]:
                part = f" (its part {source['part']!r})" if source.get("part") else ""
                problems.append(f"{filename} was drawn from {source['file']}{part} as measured on {source['date']}, but the file "
                                f"now holds other numbers (measured on {record['meta'].get('date')}): redraw it: {redraw}")
    assert not problems, "figures drawn from older results than their files now hold:\n" + "\n".join(problems)
