"""bench/speculative.py runs end to end on small settings (exercise 7's reference with tiny / tiny-draft),
prints a row per k with outputs identical to plain greedy decoding, and --save writes
results/speculative.json (here into a temporary folder) with the numbers the docs quote."""

import json

from tests.test_scripts import run_saving

SMALL = ("--ks", "1", "3", "--prompts", "2", "--new-tokens", "12", "--repeats", "1")


def test_speculative_benchmark_prints_and_saves_its_results(tmp_path):
    out = run_saving(tmp_path, "bench/speculative.py", *SMALL)
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and line.rstrip().endswith(("True", "False"))]
    assert [row[0] for row in rows] == ["1", "3"] and all(row[-1] == "True" for row in rows), out
    data = json.loads((tmp_path / "speculative.json").read_text())["data"]
    assert 0 < data["c"] and 0 <= data["alpha"] <= 1 and data["best_k"] in (1, 3)
    for k, row in data["k"].items():
        assert row["outputs_identical"] and row["generated"] == 2 * 12 and row["rounds"] <= row["generated"]
        assert 1 <= row["tokens_per_target_forward"] <= int(k) + 1 and row["speedup"] > 0
        assert row["expected_tokens_per_target_forward"] <= int(k) + 1
