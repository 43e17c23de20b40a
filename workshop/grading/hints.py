"""The hints of exercises/hints/*.md, one at a time: a Markdown viewer folds them (<details>), a terminal
does not, so `python scripts/hint.py 2 KVCache.update 1` prints hint 1 of one part and nothing else."""

import re
from dataclasses import dataclass
from pathlib import Path

HINTS_DIR = Path(__file__).resolve().parents[2] / "exercises" / "hints"
HINT = re.compile(r"<details><summary>Hint (?P<tier>\d+): (?P<title>.*?)</summary>\n(?P<body>.*?)</details>", re.S)


@dataclass
class Hint:
    part: str
    tier: int
    title: str
    body: str


def hints_file(exercise):
    """exercises/hints/<file> for "2", "ex2", "6_constrained" or "ex6_constrained"."""
    name = str(exercise).removeprefix("ex")
    path = HINTS_DIR / f"ex{name}.md"
    if not path.exists():
        known = ", ".join(sorted(p.stem.removeprefix("ex") for p in HINTS_DIR.glob("ex*.md")))
        raise ValueError(f"no hints for exercise {exercise!r}: hints exist for {known}.")
    return path


def hints(exercise):
    """Every hint of the exercise's hints file, in order: part (the ## heading), tier, title, body."""
    found = []
    for section in re.split(r"^## ", hints_file(exercise).read_text(), flags=re.M)[1:]:
        part, _, text = section.partition("\n")
        found += [Hint(part.strip(), int(m["tier"]), m["title"].strip(), m["body"].strip()) for m in HINT.finditer(text)]
    return found


def parts(exercise):
    """{part: [(tier, title)]}: what there is, without giving any of it away."""
    listing = {}
    for h in hints(exercise):
        listing.setdefault(h.part, []).append((h.tier, h.title))
    return listing


def hint(exercise, part, tier):
    """The one hint of `part` (its heading, or a unique piece of it, case-insensitive) at `tier`."""
    matching = sorted({h.part for h in hints(exercise) if part.lower() in h.part.lower()})
    exact = [p for p in matching if p.lower() == part.lower()]
    if len(exact) == 1 or len(matching) == 1:
        chosen = (exact or matching)[0]
    else:
        options = ", ".join(matching or parts(exercise))
        raise ValueError(f"{'several' if matching else 'no'} parts of exercise {exercise} match {part!r}: pick one of {options}.")
    for h in hints(exercise):
        if h.part == chosen and h.tier == tier:
            return h
    tiers = ", ".join(str(t) for t, _ in parts(exercise)[chosen])
    raise ValueError(f"{chosen} has no hint {tier}: its hints are {tiers}.")
