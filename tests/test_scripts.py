"""The demo and the benchmark run end to end (small settings) and print what they promise; --impl picks
whose engines run, and --save writes a results file (here into a temporary folder, never over the
committed results/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL_BENCH = ("--requests", "6", "--batch-size", "3", "--output-len", "2", "12")
# Runs a script with workshop.results.RESULTS_DIR pointed at argv[1]: --save then writes there.
WITH_RESULTS_DIR = ("import runpy, sys; from pathlib import Path; import workshop.results as r; "
                    "r.RESULTS_DIR = Path(sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run(*args, impl=None, check=True):
    """Run a script with WORKSHOP_IMPL set to `impl`, or unset (None)."""
    env = {key: value for key, value in os.environ.items() if key != "WORKSHOP_IMPL"}
    if impl:
        env["WORKSHOP_IMPL"] = impl
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_saving(results_dir, *args):
    """Run a script with --save into `results_dir`; the committed results files stay as they were."""
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")}
    out = run("-c", WITH_RESULTS_DIR, str(results_dir), *args, "--save").stdout
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")} == committed
    return out


def test_timed_generate_table_and_plot(tmp_path):
    out = run("timed_generate.py", "--lengths", "4", "24", "--repeats", "1", "--plot", str(tmp_path / "kv.png")).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["4", "24"]
    naive_tokens, cached_tokens = rows[-1][-3].replace(",", ""), rows[-1][-1].replace(",", "")
    assert int(naive_tokens) > int(cached_tokens)  # the KV cache pushes fewer tokens through the model
    assert (tmp_path / "kv.png").stat().st_size > 0


def test_timed_generate_saves_its_results(tmp_path):
    run_saving(tmp_path, "timed_generate.py", "--lengths", "4", "24", "--repeats", "1")
    record = json.loads((tmp_path / "timed_generate.json").read_text())
    assert record["meta"]["repeats"] == 1 and record["meta"]["threads"] == 1 and record["meta"]["machine"]
    assert sorted(record["data"]["lengths"]) == ["24", "4"]
    row = record["data"]["lengths"]["24"]
    assert row["naive_token_passes"] > row["kv_cache_token_passes"] and row["naive_s"] > 0 and row["speedup"] > 0


def test_serving_benchmark():
    out = run("bench/serving.py", *SMALL_BENCH, "--repeats", "1").stdout
    for engine in ("one-by-one", "hf-static", "hf-continuous", "static", "continuous", "continuous-poisson"):
        assert any(line.startswith(engine + " ") for line in out.splitlines()), out
        assert f"{engine}: 6/6 outputs identical" in out, out
    assert "wrote" not in out  # without --save nothing is written


def test_serving_benchmark_saves_medians_of_its_rounds(tmp_path):
    run_saving(tmp_path, "bench/serving.py", *SMALL_BENCH, "--repeats", "3", "--skip-hf", "--rate", "40")
    record = json.loads((tmp_path / "serving.json").read_text())
    assert record["meta"]["repeats"] == 3
    assert record["data"]["workload"]["requests"] == 6 and record["data"]["workload"]["rate"] == 40
    engines = record["data"]["engines"]
    assert set(engines) == {"one-by-one", "static", "continuous", "continuous-poisson", "paged"}
    for e in engines.values():
        assert e["outputs_identical"] == 6 and len(e["seconds_per_round"]) == 3
        assert sorted(e["seconds_per_round"])[1] == e["seconds"]  # the median round
    assert engines["continuous"]["median_ttft_s"] > 0 and engines["static"]["median_ttft_s"] is None
    assert engines["continuous"]["steps"] <= engines["static"]["steps"]  # no slot idles while a request waits
    assert set(record["data"]["speedups"]) == {"static_vs_one_by_one", "continuous_vs_one_by_one", "continuous_vs_static"}


@pytest.mark.parametrize("script, args", [
    ("timed_generate.py", ("--lengths", "4", "--repeats", "1")),
    ("bench/serving.py", (*SMALL_BENCH, "--repeats", "1", "--skip-hf", "--rate", "0")),
])
def test_impl_picks_whose_engines_run(script, args):
    """--impl (default: $WORKSHOP_IMPL, else the references) names whose code runs; on an unsolved stub
    the script says so in one line instead of a traceback."""
    assert "solutions/" in run(script, *args).stdout.splitlines()[0]
    assert "solutions/" in run(script, *args, "--impl", "solutions", impl="exercises").stdout.splitlines()[0]
    for proc in (run(script, *args, "--impl", "exercises", check=False), run(script, *args, impl="exercises", check=False)):
        if proc.returncode == 0:  # a checkout whose exercises are solved
            assert "exercises/" in proc.stdout.splitlines()[0]
        else:
            assert "error: not implemented yet" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
