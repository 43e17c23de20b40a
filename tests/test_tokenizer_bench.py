"""bench/tokenizer.py runs end to end on a small slice (exercise 0's reference against the tokenizers library and
tiktoken), prints every encoder's row, and --save writes results/tokenizer.json (here into a temporary folder)."""

import json

from tests.test_scripts import run_saving

SMALL = ("--chars", "4000", "--repeats", "1", "--train-chars", "2000", "--vocab-size", "300")


def test_tokenizer_benchmark_prints_and_saves_its_results(tmp_path):
    out = run_saving(tmp_path, "bench/tokenizer.py", *SMALL)
    for label in ("reference-cold", "reference-warm", "reference-no-cache", "tokenizers", "tiktoken"):
        assert any(line.startswith(label + " ") and line.rstrip().endswith("True") for line in out.splitlines()), out
    record = json.loads((tmp_path / "tokenizer.json").read_text())
    assert record["meta"]["repeats"] == 1 and record["meta"]["impl"] == "solutions"
    assert all(row["same_ids_as_tiktoken"] and row["mb_per_s"] > 0 for row in record["data"]["encoding"].values())
    training = record["data"]["training"]
    assert training["merges"] == training["tokenizers_merges"] == training["equal_merges"] == 300 - 256
    assert training["first_difference"] is None
