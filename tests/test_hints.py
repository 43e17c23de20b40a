"""Hints one at a time (workshop/grading/hints.py, scripts/hint.py): every hints file parses into parts
whose tiers run 1, 2, ...; the command prints the one hint asked for and nothing of the next."""

import subprocess
import sys
from pathlib import Path

import pytest

from workshop.grading import hints

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p.stem.removeprefix("ex") for p in hints.HINTS_DIR.glob("ex*.md"))


@pytest.mark.parametrize("exercise", FILES)
def test_every_part_has_its_tiers_in_order(exercise):
    listing = hints.parts(exercise)
    assert listing, f"no hints found in ex{exercise}.md"
    for part, tiers in listing.items():
        assert [t for t, _ in tiers] == list(range(1, len(tiers) + 1)), f"ex{exercise}.md, {part}: tiers {tiers}"


def test_the_command_shows_one_hint():
    first, second = (hints.hint("2", "KVCache.update", tier) for tier in (1, 2))
    out = subprocess.run([sys.executable, "scripts/hint.py", "2", "KVCache.update", "1"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert first.body in out and second.body not in out and "hint.py 2 'KVCache.update' 2" in out


def test_bad_requests_get_one_sentence():
    for args, says in ((["13"], "no hints for exercise '13'"), (["6_constrained", "allowed"], "several parts"),
                       (["2", "update", "9"], "has no hint 9")):
        proc = subprocess.run([sys.executable, "scripts/hint.py", *args], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 1 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
