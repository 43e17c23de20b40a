"""bench/cuda_graphs.py (module 11): the padding arithmetic it reports, and a small run on the CPU (tiny model,
two batch sizes, four requests) whose results file goes into a temporary folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workshop import replay

ROOT = Path(__file__).resolve().parents[1]


def powers_of_two(largest):
    return sorted({1 << i for i in range(largest.bit_length()) if 1 << i < largest} | {largest})


def test_padding_counts_rows_per_real_row():
    pad = replay.padding(8, powers_of_two)
    lists = pad["lists"]
    assert lists["powers_of_two"]["sizes"] == [1, 2, 4, 8] and lists["powers_of_two"]["padded"] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert lists["powers_of_two"]["uniform"] == pytest.approx((1 + 2 + 4 + 4 + 8 * 4) / 36)
    assert lists["largest_only"]["uniform"] == pytest.approx(64 / 36) and lists["every_size"]["uniform"] == 1
    assert lists["vllm"]["sizes"] == [1, 2, 4, 8]
    best = pad["best"]["uniform"]
    assert [b["graphs"] for b in best] == list(range(1, 9)) and best[-1]["rows_per_real_row"] == 1
    assert all(b["sizes"][-1] == 8 and len(b["sizes"]) == b["graphs"] for b in best)
    assert all(a["rows_per_real_row"] >= b["rows_per_real_row"] for a, b in zip(best, best[1:]))
    assert best[3]["rows_per_real_row"] <= lists["powers_of_two"]["uniform"]  # 4 sizes: no worse than powers of two


def test_best_sizes_follow_the_batches_seen():
    assert replay.best_sizes([3, 3, 3, 8], 2, 8) == [3, 8]
    assert replay.padding(8, powers_of_two, measured=[3, 3, 8])["lists"]["powers_of_two"]["measured"] == pytest.approx((4 + 4 + 8) / 14)


def test_op_kinds():
    assert replay.kind("aten.addmm.default") == "matmul" and replay.kind("aten.view.default", is_view=True) == replay.VIEW
    assert replay.kind("aten._scaled_dot_product_flash_attention_for_cpu.default") == "attention"
    assert replay.kind("aten.index_copy_.default") == "gather / scatter" and replay.kind("aten.native_layer_norm.default") == "layer norm"


def test_cuda_graphs_bench_saves_its_results(tmp_path):
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")}
    env = {**os.environ, "WORKSHOP_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "bench/cuda_graphs.py", "--device", "cpu", "--batch-sizes", "1", "2", "--requests", "4",
                           "--batch-size", "4", "--output-len", "2", "8", "--repeats", "1", "--steps", "1", "--engine-repeats", "1",
                           "--copy-mib", "8", "--save"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*.json")} == committed
    data = json.loads((tmp_path / "cuda_graphs.json").read_text())["data"]
    assert data["device"] == "cpu" and not data["graphs_are_cuda"] and "CPUGraph" in data["replayed_with"]
    kernels = data["kernels"]
    assert kernels["decode_step_traced"] == kernels["decode_step"]["aten_ops"] > kernels["decode_step"]["kernels"] > 0
    # the reference's decode step reads nothing on the host (its inputs in the cache's DecodeBatch, no boolean index)
    assert kernels["ex5_forward_capturable"] and kernels["ex5_forward_refused"] is None
    assert set(data["steps"]) == {"1", "2"} and set(data["steps"]["1"]) >= {"ex5", "eager", "static", "replayed"}
    assert all(data["steps"][b][p]["max_difference"] < 1e-3 for b in ("1", "2") for p in data["paths"])
    widths = data["widths"]  # 64 tokens in blocks of 16: 4 blocks, out of tiny's 512 positions (32 blocks)
    assert (widths["full"]["width"], widths["bucket"]["width"], widths["max_blocks"]) == (32, 4, 32)
    assert widths["bucket"]["keys_per_row"] == 64 and widths["full"]["keys_per_row"] == 512
    assert widths["full"]["ops"]["aten_ops"] == widths["bucket"]["ops"]["aten_ops"]  # the same kernels, narrower shapes
    assert max(widths["full"]["max_difference"], widths["bucket"]["max_difference"]) < 1e-3 and widths["bucket_over_full"] > 0
    engines = data["engine"]["engines"]
    assert set(engines) == {"ex5", "graphs_off", "graphs_on"} and not data["engine"]["default_graphs"]
    assert all(e["outputs_identical"] == 4 for e in engines.values())
    assert data["targets"]["batch1_replayed_over_ex5"]["met"] is None  # a GPU's target
