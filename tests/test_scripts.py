"""The demo and the benchmark run end to end (small settings) and print what they promise; --impl picks
whose engines run, and --save writes a results file (here into a temporary folder, never over the
committed results/). The serving benchmark's accounting: every request sent is completed or failed,
the tokens its metrics count are the tokens the engines produced, online and offline."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpt
from solutions import ex2_kv_cache as ex2
from solutions import ex3_static_batching as ex3
from solutions import ex4_continuous_batching as ex4
from solutions import ex5_paged_kv_cache as ex5
from workshop.serving import runs as serving
from workshop.serving import bench as serving_bench
from workshop.serving import report as serving_report
from workshop.serving.client import launch_server, run_online
from workshop.serving.workloads import mixed_workload

ROOT = Path(__file__).resolve().parents[1]
SMALL_BENCH = ("--requests", "6", "--batch-size", "3", "--output-len", "2", "12", "--no-progress")
# the course's evaluation and speculative decoding, tiny
SMALL_PARTS = ("--eval-requests", "4", "--input-len", "8", "--eval-output-len", "2", "8", "--spec-requests", "2",
               "--spec-output-len", "4", "8")
ONLY_MIXED = ("--skip-eval", "--skip-spec", "--kv-budget", "0")


def run(*args, impl=None, check=True, results_dir=None):
    """Run a script with WORKSHOP_IMPL set to `impl`, or unset (None); its results files go to `results_dir`
    (WORKSHOP_RESULTS_DIR) when one is given."""
    env = {key: value for key, value in os.environ.items() if key not in ("WORKSHOP_IMPL", "WORKSHOP_RESULTS_DIR")}
    if impl:
        env["WORKSHOP_IMPL"] = impl
    if results_dir:
        env["WORKSHOP_RESULTS_DIR"] = str(results_dir)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_saving(results_dir, *args):
    """Run a script with --save into `results_dir`; the committed results files stay as they were."""
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")}
    out = run(*args, "--save", results_dir=results_dir).stdout
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")} == committed
    return out


def test_timed_generate_table_and_plot(tmp_path):
    out = run("timed_generate.py", "--lengths", "4", "24", "--repeats", "1", "--plot", str(tmp_path / "kv.png")).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["4", "24"]
    naive_tokens, cached_tokens = rows[-1][-3].replace(",", ""), rows[-1][-1].replace(",", "")
    assert int(naive_tokens) > int(cached_tokens)  # the KV cache pushes fewer tokens through the model
    assert (tmp_path / "kv.png").stat().st_size > 0
    assert all(row[-4] in ("compute", "overhead") for row in rows), rows  # what each row's time is bound by
    assert "torch operations whatever the length" in out


def test_timed_generate_saves_its_results(tmp_path):
    run_saving(tmp_path, "timed_generate.py", "--lengths", "4", "24", "--repeats", "1")
    record = json.loads((tmp_path / "timed_generate.json").read_text())
    assert record["meta"]["repeats"] == 1 and record["meta"]["threads"] == 1 and record["meta"]["machine"]
    assert sorted(record["data"]["lengths"]) == ["24", "4"]
    row = record["data"]["lengths"]["24"]
    assert row["naive_token_passes"] > row["kv_cache_token_passes"] and row["naive_s"] > 0 and row["speedup"] > 0
    assert row["bound_by"] in ("compute", "overhead") and record["data"]["torch_ops_per_step"] > 10


def test_serving_benchmark():
    out = run("bench/serving.py", *SMALL_BENCH, *ONLY_MIXED, "--repeats", "1").stdout
    for engine in ("one-by-one", "hf-static", "hf-continuous", "static", "continuous", "continuous-poisson"):
        assert any(line.startswith(engine + " ") for line in out.splitlines()), out
        assert f"{engine}: 6/6 outputs identical" in out, out
    assert "TTFT median" in out and "ITL p99" in out and "targets:" in out  # vLLM's metrics, the targets
    assert "wrote" not in out  # without --save nothing is written


@pytest.mark.full  # the whole benchmark, three rounds: a long run (tests/conftest.py)
def test_serving_benchmark_saves_medians_of_its_rounds(tmp_path):
    run_saving(tmp_path, "bench/serving.py", *SMALL_BENCH, *SMALL_PARTS, "--repeats", "3", "--skip-hf", "--rate", "40",
               "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "rows.csv"))
    record = json.loads((tmp_path / "serving.json").read_text())
    assert record["meta"]["repeats"] == 3
    data = record["data"]
    assert data["workload"]["requests"] == 6 and data["workload"]["rate"] == 40
    engines = data["engines"]
    assert set(engines) == {"one-by-one", "static", "continuous", "continuous-poisson", "paged"}
    for e in engines.values():
        assert e["outputs_identical"] == 6 and len(e["seconds_per_round"]) == 3
        assert sorted(e["seconds_per_round"])[1] == e["seconds"]  # the median round
    assert engines["continuous"]["median_ttft_s"] > 0 and engines["static"]["median_ttft_s"] is None
    assert engines["continuous"]["steps"] <= engines["static"]["steps"]  # no slot idles while a request waits
    assert set(data["speedups"]) == {"static_vs_one_by_one", "continuous_vs_one_by_one", "continuous_vs_static"}
    assert data["kv_budget"]["paged"]["preemptions"] == 0

    evaluation = data["evaluation"]
    at_once, low, high = (e["request_rate"] for e in evaluation["rates"])
    assert at_once == "inf"
    assert low < evaluation["capacity"]["request_throughput"] < high  # one rate below the capacity, one above
    for entry in evaluation["rates"]:
        assert set(entry["engines"]) == {"one-by-one", "static", "dynamic", "continuous", "paged"}
        assert all(e["outputs_identical"] == 4 for e in entry["engines"].values())
    assert data["speculative"]["outputs_identical"] == 2 and data["speculative"]["speedup"] > 0
    # no transformers engines, no server in this run: the KV utilisation and the paged engine's share of the ceiling
    assert set(data["targets"]) == {"paged_kv_utilization", "paged_of_ceiling", "paged_of_ceiling_at_budget_batch"}
    share = data["targets"]["paged_of_ceiling"]
    assert share["ratio"] == data["ceiling"]["fraction"]["paged"] and share["met"] == (share["ratio"] >= share["target"] == 0.75)
    for ceiling in (data["ceiling"], data["ceiling"]["at_paged_batch"]):  # what the paged schedule allows, once a round
        assert len(ceiling["schedule"]["tokens_per_s_per_round"]) == 3 and ceiling["schedule"]["of_ceiling"] > 0
    assert share["schedule_allows"] == data["ceiling"]["schedule"]["of_ceiling"]
    assert set(data["step_split"]["engines"]) == {"continuous", "paged"}
    assert data["step_split"]["engines"]["paged"]["host_reads_per_step"]["total"] == 1  # the new token ids, nothing more

    # --out: one row per engine and load, JSON and CSV, every request accounted for, every token counted
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert rows == json.loads((tmp_path / "serving_rows.json").read_text())  # --save writes the same rows
    with open(tmp_path / "rows.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["engine"] for r in table] == [r["engine"] for r in rows]
    sent = {"mixed": 6, "course": 4, "batch-1": 2}
    tokens = {"mixed": data["workload"]["tokens"], "course": evaluation["tokens"], "batch-1": data["speculative"]["tokens"]}
    assert len(rows) == len(engines) + 3 * 5 + 2
    for row, line in zip(rows, table):
        assert set(serving_bench.METRICS) <= set(row), set(serving_bench.METRICS) - set(row)
        assert row["completed"] + row["failed"] == sent[row["scenario"]] and row["failed"] == 0, row
        assert row["total_output_tokens"] == tokens[row["scenario"]], row  # EOS ignored: exactly the tokens asked for
        assert row["output_throughput"] > 0 and float(line["output_throughput"]) == pytest.approx(row["output_throughput"])

    # docs/benchmarks.md and its plots, from the record alone
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == serving_report.markdown(record)
    for name in serving_report.FIGURES.values():
        assert (tmp_path / "docs" / "img" / name).stat().st_size > 0


def test_serving_metrics_as_vllm_defines_them():
    records = [serving.RequestRecord(10, 3, 0.0, [0.1, 0.2, 0.4]),  # TTFT 100 ms, ITL 100 and 200 ms, TPOT 150 ms
               serving.RequestRecord(20, 1, 0.5, [0.8]),  # one token: TTFT = E2EL = 300 ms, no TPOT, no ITL
               serving.RequestRecord(30, 0, 1.0, [], success=False, error="boom")]
    m = serving.serving_metrics(records, duration=2.0, goodput=serving.parse_goodput(["ttft:200", "tpot:500"]))
    assert (m["completed"], m["failed"], m["total_input_tokens"], m["total_output_tokens"]) == (2, 1, 30, 4)
    assert (m["request_throughput"], m["output_throughput"], m["total_token_throughput"]) == (1.0, 2.0, 17.0)
    assert m["request_goodput"] == 0.5  # only the first met TTFT <= 200 ms
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_tpot_ms"] == pytest.approx(150)
    assert m["mean_itl_ms"] == pytest.approx(150) and m["p99_e2el_ms"] == pytest.approx(400 - 0.01 * 100)
    assert serving.serving_metrics(records[2:], 1.0)["mean_ttft_ms"] is None  # nothing completed: no latency
    with pytest.raises(ValueError, match="ttft, tpot or e2el"):
        serving.parse_goodput(["latency:5"])


def test_offline_runners_account_for_every_request_and_token():
    """Every runner, on a tiny workload arriving as a Poisson process: each request completes with the
    tokens it asked for, the metrics count exactly the tokens produced, each token has its time (the
    engines are watched per step), and no token comes before its request arrived."""
    model = gpt.load_model("tiny")
    workload = mixed_workload(model, 5, prompt_len=(4, 12), output_len=(1, 9), rate=200, seed=3)
    runs = [serving.run_one_by_one(ex2.generate, model, workload),
            serving.run_static(ex3, model, workload, 2),
            serving.run_dynamic(ex3, model, workload, 2, window=0.002),
            serving.run_continuous(ex4, model, workload, 2),
            serving.run_paged(ex5, model, workload, 2)]
    for run in runs:
        m = run.metrics()
        assert (m["completed"], m["failed"]) == (5, 0), run.label
        assert m["total_output_tokens"] == run.tokens == sum(map(len, run.outputs)) == sum(workload.max_new_tokens), run.label
        for record, arrival, n in zip(run.records, workload.arrival_times, workload.max_new_tokens):
            assert record.output_len == len(record.token_times) == n, run.label
            assert record.arrival_s >= arrival - 1e-9 and record.token_times[0] >= record.arrival_s, run.label
            assert record.token_times == sorted(record.token_times), run.label


@pytest.mark.skipif(not (ROOT / "serve.py").exists(), reason="no serve.py in this checkout")
@pytest.mark.full  # a server and bench/serve_bench.py against it (tests/test_serving_online.py runs serve.py online in CI)
def test_online_benchmark_against_the_server(tmp_path):
    """serve.py on a free port, a few streaming requests through the benchmark's client (aiohttp): all complete,
    the server's token count is what its engine produces offline, and so is the text; then
    bench/serve_bench.py against the same server prints vLLM's result block and writes its row."""
    model = gpt.load_model("tiny")
    workload = mixed_workload(model, 4, prompt_len=(4, 12), output_len=(2, 10), seed=5)
    with launch_server("tiny", max_batch_size=2) as base_url:
        online = run_online(base_url, workload, progress=False)
        out = run("bench/serve_bench.py", "--base-url", base_url, "--num-prompts", "3", "--output-len", "2", "6", "--no-progress",
                  "--out", str(tmp_path / "online.json")).stdout
    offline = serving.run_paged(ex5, model, workload, 2, eos_token_id=gpt.EOS_TOKEN_ID)
    m = online.metrics()
    assert (m["completed"], m["failed"]) == (4, 0), [r.error for r in online.records]
    assert m["total_output_tokens"] == offline.tokens == sum(map(len, offline.outputs))
    assert online.outputs == [gpt.load_tokenizer().decode(tokens) for tokens in offline.outputs]
    assert all(r.token_times[0] > r.arrival_s for r in online.records) and m["mean_ttft_ms"] > 0 and m["mean_itl_ms"] is not None

    assert "Successful requests:                    3" in out and "Failed requests:                        0" in out, out
    assert "Mean ITL (ms):" in out and "P99 E2EL (ms):" in out
    (row,) = json.loads((tmp_path / "online.json").read_text())
    assert row["mode"] == "online" and row["completed"] == 3 and row["output_throughput"] > 0


def test_benchmarks_page_is_the_committed_record():
    """docs/benchmarks.md is what bench/serving.py draws from results/serving.json: no number typed."""
    record = json.loads((ROOT / "results" / "serving.json").read_text())
    if "evaluation" not in record["data"]:
        pytest.skip("results/serving.json predates the course's evaluation: run python bench/serving.py --save --online")
    assert (ROOT / "docs" / "benchmarks.md").read_text() == serving_report.markdown(record), (
        "docs/benchmarks.md differs from what results/serving.json gives: run python bench/serving.py --report")


@pytest.mark.parametrize("script, args", [
    ("timed_generate.py", ("--lengths", "4", "--repeats", "1")),
    pytest.param("bench/serving.py", (*SMALL_BENCH, *ONLY_MIXED, "--repeats", "1", "--skip-hf", "--rate", "0"),
                 marks=pytest.mark.full),  # the same switch as timed_generate.py's (workshop.grading.harness), four runs
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
