"""One source for every number: each measured number in the README, the decks and the notebooks'
prose is a marked span filled from a results file (workshop/results/store.py), and matches it."""

import re

import pytest

from workshop import results

DOCS = results.documents()
# What a typed-in measurement looks like: a speed-up, a rate, a duration, a percentage of slots.
# (A shape such as "50,257 x 128" or a formula such as "2 × P" has a space before its x: not a speed-up.)
MEASURED = re.compile(r"\b\d[\d,.]*(?:[x×](?![\w])|\s?(?:tok(?:en)?s?/s\b|ms\b|s\b(?! ?\w)|%))")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_marked_numbers_match_their_results_files(path):
    assert path.read_text() == results.refreshed(path), (
        f"{path.name} quotes numbers that its results files no longer hold: run `python scripts/update_docs.py`.")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_no_measured_number_is_typed_by_hand(path):
    text = path.read_text()
    if path.suffix == ".ipynb":  # prose only: code cells compute their numbers live
        import json

        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "markdown")
    typed = [m.group(0) for m in MEASURED.finditer(results.without_marked(text))]
    assert not typed, (f"{path.name} types measured numbers by hand: {typed[:10]}. Quote them from a results file with "
                       f"<!--r:FILE:PATH:FORMAT-->...<!--/r--> (see workshop/results/store.py), or rephrase without a number.")
