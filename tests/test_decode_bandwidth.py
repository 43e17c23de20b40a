"""bench/decode_bandwidth.py: batch-1 decode against the measured copy bandwidth, on the CPU (tiny model,
few tokens), its results file written into a temporary folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpt
from workshop import bandwidth

ROOT = Path(__file__).resolve().parents[1]


def test_decode_bytes_are_the_weights_and_the_kv_cache_at_the_mean_context():
    model = gpt.load_model("tiny", device="cpu")
    need = bandwidth.decode_bytes(model, prompt_len=16, new_tokens=256)
    c = model.config
    assert need["weight_bytes"] == 4 * model.num_parameters()  # float32, the tied output layer once
    assert need["mean_context"] == 16 + 128
    assert need["kv_bytes"] == 2 * c.n_layer * c.n_embd * 4 * 144
    assert need["bytes_per_step"] == need["weight_bytes"] + need["kv_bytes"]


def test_decode_bandwidth_bench_saves_its_results(tmp_path):
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")}
    env = {**os.environ, "WORKSHOP_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "bench/decode_bandwidth.py", "--device", "cpu", "--new-tokens", "6", "--repeats", "1",
                           "--copy-mib", "8", "--copy-repeats", "2", "--save"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "of the bandwidth limit" in proc.stdout and "read + written" in proc.stdout
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")} == committed
    record = json.loads((tmp_path / "decode_bandwidth.json").read_text())
    data = record["data"]
    assert record["meta"]["device"] == "cpu" and record["meta"]["bandwidth_counts"] == "read + written"
    assert (data["model"], data["dtype"], data["new_tokens"]) == ("tiny", "float32", 6)
    assert data["bandwidth"]["bytes_moved"] == 2 * 8 * 2**20 and data["time"]["step_s"] > 0
    assert data["share_of_bandwidth_limit"] == pytest.approx(
        data["bytes"]["bytes_per_step"] / data["time"]["step_s"] / data["bandwidth"]["bytes_per_s"])
