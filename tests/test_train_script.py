"""scripts/train.py trains on any text file, writes an HF-format checkpoint that loads, and resumes."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

import gpt

ROOT = Path(__file__).resolve().parents[1]


def train(text, out, *extra):
    cmd = [sys.executable, "scripts/train.py", "--text", str(text), "--out", str(out), "--n-layer", "1", "--n-embd", "32",
           "--n-head", "2", "--context", "64", "--block-size", "32", "--batch-size", "2", "--eval-every", "2", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_trains_on_any_text_and_resumes(tmp_path):
    text = tmp_path / "any.txt"
    text.write_text((ROOT / "gpt.py").read_text())  # any text will do: here, the model's own source
    out = tmp_path / "model"
    train(text, out, "--max-steps", "3")
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 3 and log["best_val_loss"] < 11.5
    model = gpt.load_model(out, device="cpu")
    assert model.config.n_layer == 1 and model.config.n_positions == 64
    assert GPT2LMHeadModel.from_pretrained(out).config.n_embd == 32
    assert (out / "README.md").exists() and "Validation loss" in (out / "README.md").read_text()
    assert torch.load(out / "train_state.pt", weights_only=False)["step"] == 3

    resumed = train(text, out, "--max-steps", "5", "--resume")
    assert "resuming at step 3" in resumed.stdout
    assert json.loads((out / "training_log.json").read_text())["steps"] == 5


def test_too_short_text_is_refused(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("To be, or not to be.")
    proc = subprocess.run([sys.executable, "scripts/train.py", "--text", str(text), "--out", str(tmp_path / "m")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "too few" in proc.stderr and "Traceback" not in proc.stderr
