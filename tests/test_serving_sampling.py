"""bench/serving.py's greedy-against-sampled part: the paged engine on the same workload greedy and at a
temperature, its record, its two rows, its target and its section of docs/benchmarks.md; and
--only-sampling from the command line.

    pytest tests/test_serving_sampling.py
"""

import subprocess
import sys
from pathlib import Path

import gpt
import solutions.ex5_paged_kv_cache as ex5
from workshop.serving import bench as serving_bench
from workshop.serving import report as serving_report
from workshop.serving.workloads import mixed_workload

ROOT = Path(__file__).resolve().parents[1]


def test_sampled_against_greedy_record_rows_target_and_docs():
    model = gpt.load_model("tiny", device="cpu")
    workload = mixed_workload(model, 4, prompt_len=(4, 8), output_len=(2, 6), seed=0)
    record = serving_bench.sampled_vs_greedy(model, ex5, workload, 2, 1.0, repeats=1, progress=False)
    tokens = sum(workload.max_new_tokens)
    assert record["greedy"]["total_output_tokens"] == record["sampled"]["total_output_tokens"] == tokens  # the same work
    assert record["sampled_over_greedy"] > 0 and record["temperature"] == 1.0
    data = {"sampling": record}
    target = serving_bench.targets(data)["sampled_over_greedy"]
    assert target["ratio"] == record["sampled_over_greedy"] and target["met"] == (target["ratio"] >= target["target"] == 0.95)
    assert [row["engine"] for row in serving_bench.rows(data)] == ["paged, greedy", "paged, temperature 1"]
    page = serving_report.markdown({"meta": {"machine": "m", "device": "cpu", "threads": 1, "date": "d", "torch": "t",
                                             "command": "c", "repeats": 1}, "data": data})
    assert "### Greedy and sampled" in page and "| temperature 1 | 4/4 |" in page


def test_only_sampling_from_the_command_line():
    out = subprocess.run([sys.executable, "bench/serving.py", "--only-sampling", "--requests", "4", "--batch-size", "2",
                          "--prompt-len", "4", "8", "--output-len", "2", "6", "--repeats", "1", "--no-progress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "temperature 1 / greedy output throughput" in out.stdout and "wrote" not in out.stdout, out.stdout
