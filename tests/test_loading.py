"""Every way of loading a model works, and every way it can fail says what to do in one sentence."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpt

ROOT = Path(__file__).resolve().parents[1]


def one_sentence(message):
    return "\n" not in message and message.rstrip().endswith(".") and len(message) < 300


def gpt2_style_checkpoint(folder):
    """A small model saved like OpenAI's original pytorch_model.bin: no config.json, no 'transformer.'
    prefix, Conv1D weights stored [in, out]. Heads 64 wide, as in every GPT-2, so the shapes say it all."""
    model = gpt.new_model(gpt.GPTConfig(n_layer=2, n_embd=128, n_head=2, n_positions=64))
    state = {}
    for key, value in model.state_dict().items():
        if key != "lm_head.weight":
            state[key.removeprefix("transformer.")] = value.t() if key.endswith(gpt.CONV1D_SUFFIXES) else value
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.bin")
    return model


def test_pytorch_model_bin_without_config(tmp_path):
    original = gpt2_style_checkpoint(tmp_path)
    for source in (tmp_path / "pytorch_model.bin", tmp_path):
        loaded = gpt.load_model(source, device="cpu")
        assert loaded.config == original.config
        ids = torch.randint(0, 50257, (1, 10))
        pos = torch.arange(10)[None]
        assert torch.equal(loaded(ids, pos), original(ids, pos))


def test_dtype_and_device():
    model = gpt.load_model("tiny-draft", device="cpu", dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16 and model.device.type == "cpu" and not model.training


@pytest.mark.parametrize("name,expected", [
    ("gpt3", "Unknown model 'gpt3'"),
    ("/no/such/dir/pytorch_model.bin", "No such file or folder"),
    ("missing_folder/", "No such file or folder"),
])
def test_bad_names(name, expected):
    with pytest.raises(gpt.ModelLoadError) as error:
        gpt.load_model(name)
    assert expected in str(error.value) and one_sentence(str(error.value))


def test_corrupt_and_incomplete_files(tmp_path):
    (tmp_path / "corrupt.bin").write_bytes(b"not a checkpoint at all")
    (tmp_path / "corrupt.safetensors").write_bytes(b"\x00" * 64)
    (tmp_path / "empty").mkdir()
    torch.save({"wte.weight": torch.zeros(10, 4)}, tmp_path / "partial.bin")
    for path, expected in [("corrupt.bin", "corrupt"), ("corrupt.safetensors", "corrupt"), ("empty", "No model.safetensors"),
                           ("partial.bin", "not a GPT-2 checkpoint")]:
        with pytest.raises(gpt.ModelLoadError) as error:
            gpt.load_model(tmp_path / path)
        assert expected in str(error.value) and one_sentence(str(error.value)), str(error.value)


def test_config_that_disagrees_with_weights(tmp_path):
    model = gpt.load_model("tiny-draft", device="cpu")
    gpt.save_model(model, tmp_path)
    width = model.config.n_embd
    config = (tmp_path / "config.json").read_text().replace(f'"n_embd": {width}', f'"n_embd": {width + 32}')
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(gpt.ModelLoadError, match="disagree"):
        gpt.load_model(tmp_path)


def test_unreachable_hub_says_what_to_do(tmp_path):
    """No network and an empty cache: one sentence, no traceback, also from the command line."""
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    code = "import gpt\ntry:\n    gpt.load_model('gpt2')\nexcept gpt.ModelLoadError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "Could not get 'gpt2'" in out.stdout and one_sentence(out.stdout.strip()), out.stdout + out.stderr
    cli = subprocess.run([sys.executable, "timed_generate.py", "--model", "gpt2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr and "Could not get 'gpt2'" in cli.stderr, cli.stderr
