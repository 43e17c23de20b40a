"""The demo and the benchmark run end to end (small settings) and print what they promise."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_timed_generate_table_and_plot(tmp_path):
    out = run("timed_generate.py", "--lengths", "4", "24", "--repeats", "1", "--plot", str(tmp_path / "kv.png"))
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["4", "24"]
    naive_tokens, cached_tokens = rows[-1][-3].replace(",", ""), rows[-1][-1].replace(",", "")
    assert int(naive_tokens) > int(cached_tokens)  # the KV cache pushes fewer tokens through the model
    assert (tmp_path / "kv.png").stat().st_size > 0


def test_serving_benchmark():
    out = run("bench/serving.py", "--requests", "6", "--batch-size", "3", "--output-len", "2", "12")
    for engine in ("hf-static", "hf-continuous", "static", "continuous"):
        assert any(line.startswith(engine + " ") for line in out.splitlines()), out
    assert "hf-static: 6/6 outputs identical" in out and "hf-continuous: 6/6 outputs identical" in out, out
