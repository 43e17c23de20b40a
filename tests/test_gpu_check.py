"""scripts/gpu_check.py: without a GPU it refuses in one sentence; its dry run on the CPU goes through the
same plumbing (steps as subprocesses, results files, the table last); a step that runs out of time is
killed with everything it started."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workshop import gpu_check

ROOT = Path(__file__).resolve().parents[1]


def run(*args, results_dir=None):
    env = {key: value for key, value in os.environ.items() if key != "WORKSHOP_RESULTS_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])  # as on a machine with no install
    return subprocess.run([sys.executable, "scripts/gpu_check.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run")
def test_refuses_without_a_gpu_in_one_sentence():
    proc = run()
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "needs a CUDA GPU" in proc.stderr and "--cpu-dry-run" in proc.stderr


def test_dry_run_writes_its_record_and_prints_the_table_last(tmp_path):
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")}
    proc = run("--cpu-dry-run", "--steps", "decode", "attention", "--results-dir", str(tmp_path / "results"),
               "--logs", str(tmp_path / "logs"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")} == committed
    record = json.loads((tmp_path / "results" / "gpu_check.json").read_text())
    data = record["data"]
    assert data["dry_run"] and data["passed"] and [s["name"] for s in data["steps"]] == ["decode", "attention"]
    assert all(s["status"] == "passed" and s["seconds"] > 0 for s in data["steps"])
    assert data["steps"][0]["share_of_bandwidth_limit"] > 0 and "of the bandwidth limit" in data["steps"][0]["note"]
    assert (tmp_path / "results" / "decode_bandwidth.json").exists() and (tmp_path / "results" / "attention.json").exists()
    assert (tmp_path / "logs" / "decode.log").read_text()
    table = proc.stdout.rstrip().splitlines()[-3:]
    assert table[0].split()[:3] == ["step", "status", "s"] and table[1].startswith("decode ") and table[2].startswith("attention ")


def test_a_step_out_of_time_is_killed_with_its_children(tmp_path):
    spawner = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
               "print(child.pid, flush=True); time.sleep(60)")
    start = time.monotonic()
    record = gpu_check.run_step(gpu_check.Step("sleeper", ["-c", spawner], timeout_s=5.5), tmp_path, echo=False)
    assert record["status"] == "timed out" and time.monotonic() - start < 20
    grandchild = int((tmp_path / "sleeper.log").read_text().split()[0])
    for _ in range(50):  # killed; gone once its parent (killed too) no longer holds it as a zombie
        if not Path(f"/proc/{grandchild}").exists() or "zombie" in Path(f"/proc/{grandchild}/status").read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {grandchild} outlived the step")


def test_checker_counts_and_failing_ids(tmp_path):
    output = ("FAILED exercises/test_ex2_kv_cache.py::test_speedup_over_naive_grows_with_length - the KV cache...\n"
              "========= 1 failed, 243 passed, 2 skipped in 39.12s =========\n")
    assert gpu_check.checker_counts(output) == ({"failed": 1, "passed": 243, "skipped": 2},
                                                ["exercises/test_ex2_kv_cache.py::test_speedup_over_naive_grows_with_length"])
    results_json = tmp_path / "results.json"
    results_json.write_text(json.dumps({"tests": [{"name": "a::b", "status": "passed"}, {"name": "a::c", "status": "failed"}]}))
    assert gpu_check.checker_counts(output, results_json)[1] == ["a::c"]
