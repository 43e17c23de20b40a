"""bench/attention.py runs end to end on small settings (exercise 10's reference): the counted bytes agree with
the formulas, every path is timed, the CUDA section is skipped cleanly without a GPU, and --save writes
results/attention.json (here into a temporary folder) with the numbers the deck and notebook quote; the stub
ends it with one line."""

import json

import torch

from tests.test_scripts import run, run_saving

SMALL = ("--heads", "2", "--head-dim", "16", "--block", "16", "--byte-lengths", "64", "256", "--counted-up-to", "64",
         "--prefill-lengths", "32", "64", "--decode-lengths", "64", "--chunk", "32", "--repeats", "1")


def test_attention_benchmark_prints_and_saves_its_results(tmp_path):
    out = run_saving(tmp_path, "bench/attention.py", *SMALL)
    assert "(counted)" in out and "prefill T=   64" in out and "decode  T=   64" in out, out
    data = json.loads((tmp_path / "attention.json").read_text())["data"]
    assert data["bytes"]["64"]["counted"] and data["bytes"]["64"]["max_error_vs_sdpa"] < 1e-5
    assert all(row["standard_over_flash"] > 1 for row in data["bytes"].values())
    assert set(data["cpu_prefill"]["64"]) >= {"sdpa_ms", "standard_ms", "flash_tiles_ms"}
    assert set(data["cpu_decode"]["64"]) >= {"sdpa_ms", "flash_decoding_ms", "paged_flash_decoding_ms"}
    if not torch.cuda.is_available():
        assert data["cuda"] == {"available": False, "reason": "no CUDA device on the machine that ran the benchmark"}
        assert "CUDA: no GPU here, section skipped" in out


def test_attention_benchmark_on_the_stub_says_so_in_one_line():
    proc = run("bench/attention.py", *SMALL, "--impl", "exercises", check=False)
    assert proc.returncode != 0 and proc.stderr.strip().startswith("error: not implemented yet. Exercise 10:"), proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
