"""Results files keep CPU and GPU numbers side by side: a measurement on a CUDA device is saved as
results/<name>_<card>.json (the card's short tag), never over the CPU's results/<name>.json."""

import json

import pytest
import torch

from workshop.results import store


@pytest.fixture
def gpu(monkeypatch):
    """Pretend the CUDA device is the named card (the naming needs only its name)."""
    def pretend(name):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return pretend


@pytest.mark.parametrize("name, tag", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "t4"), ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"), ("NVIDIA L40S", "l40s")])
def test_card_tags(gpu, name, tag):
    gpu(name)
    assert store.card("cuda") == tag


def test_file_names_on_cpu_and_gpu(gpu):
    gpu("NVIDIA H200")
    assert store.file_name("serving") == store.file_name("serving", "cpu") == store.file_name("serving", torch.device("cpu")) == "serving"
    # the names someone copies the H200's files in under
    assert [store.file_name(n, "cuda") for n in ("serving", "serving_rows", "attention")] == ["serving_h200", "serving_rows_h200", "attention_h200"]
    assert store.file_name("decode_bandwidth", "cuda:0") == store.file_name("decode_bandwidth", torch.device("cuda")) == "decode_bandwidth_h200"


def test_save_on_a_gpu_leaves_the_cpu_file(gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(store, "RESULTS_DIR", tmp_path)
    cpu_path = store.save("example", {"x": 1}, repeats=1)
    gpu("NVIDIA H100 80GB HBM3")
    gpu_path = store.save("example", {"x": 2}, repeats=1, device="cuda")
    assert (cpu_path.name, gpu_path.name) == ("example.json", "example_h100.json")
    assert store.load("example")["data"] == {"x": 1} and "card" not in store.load("example")["meta"]
    record = store.load("example", "cuda")
    assert record["data"] == {"x": 2} and record["meta"]["card"] == "NVIDIA H100 80GB HBM3"
    assert json.loads(gpu_path.read_text()) == record


def test_machine_names_the_device_measured_on(gpu, monkeypatch, tmp_path):
    """A CPU measurement on a machine with a GPU names the CPU: the card is not what ran it."""
    monkeypatch.setattr(store, "RESULTS_DIR", tmp_path)
    gpu("NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert store.machine("cuda") == "NVIDIA H100 80GB HBM3 GPU"
    assert "CPU" in store.machine("cpu") and "H100" not in store.machine("cpu")
    assert "H100" not in json.loads(store.save("example", {"x": 1}, repeats=1).read_text())["meta"]["machine"]


def test_another_dtype_is_saved_beside_float32():
    """bench/serving.py --dtype float16 writes serving_float16[_<card>].json: the float32 record the README quotes stays."""
    assert [store.with_dtype(n, "float32") for n in ("serving", "serving_rows")] == ["serving", "serving_rows"]
    assert [store.with_dtype(n, "float16") for n in ("serving", "cuda_graphs")] == ["serving_float16", "cuda_graphs_float16"]
