"""gpt.py is GPT-2: the same logits and the same greedy text as transformers' GPT2LMHeadModel."""

import pytest
import torch
from transformers import GPT2LMHeadModel

import gpt
import solutions.ex1_generate as naive
from workshop.grading.harness import transformers_greedy

EMBEDDED = ["tiny", "tiny-draft"]


def hf_and_ours(path):
    hf = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32).eval()
    return hf, gpt.load_model(path, device="cpu")


@pytest.mark.parametrize("name", EMBEDDED)
def test_logits_equal_transformers(name):
    hf, ours = hf_and_ours(gpt.MODELS_DIR / name)
    ids = torch.randint(0, hf.config.vocab_size, (3, 97), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(97).expand(3, -1)
    with torch.no_grad():
        diff = (ours(ids, positions) - hf(ids).logits).abs().max().item()
    assert diff < 1e-4, f"max |logits - HF logits| = {diff:.2e} on {name}"


@pytest.mark.parametrize("name", EMBEDDED)
def test_greedy_equals_transformers_generate(name):
    hf, ours = hf_and_ours(gpt.MODELS_DIR / name)
    tok = gpt.load_tokenizer()
    for prompt in ["ROMEO:", "First Citizen:\nWe are accounted poor", "KING RICHARD III:\nNow is the", "What"]:
        ids = tok.encode(prompt)
        assert naive.generate(ours, ids, 40) == transformers_greedy(hf, ids, 40, gpt.EOS_TOKEN_ID), prompt


def test_embedded_models_are_small_and_trained():
    for name, (low, high) in {"tiny": (6e6, 8e6), "tiny-draft": (1.2e6, 3.7e6)}.items():
        n = gpt.load_model(name, device="cpu").num_parameters()
        assert low < n < high, f"{name} has {n:,} parameters"
    total = sum((gpt.MODELS_DIR / n / "model.safetensors").stat().st_size for n in EMBEDDED)
    assert total < 25e6, f"the embedded checkpoints take {total / 1e6:.1f} MB"


def test_random_sizes_have_gpt2_shapes():
    model = gpt.load_model("random-124M", device="cpu")
    assert model.num_parameters() == 124_439_808  # GPT-2 small, tied embeddings
    assert model.lm_head.weight is model.transformer.wte.weight


def test_real_gpt2_when_cached():
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache("gpt2", "model.safetensors"), str):
        pytest.skip("real GPT-2 weights are not in the Hugging Face cache (run once online: python -c \"import gpt; gpt.load_model('gpt2')\")")
    hf = GPT2LMHeadModel.from_pretrained("gpt2", dtype=torch.float32).eval()
    ours = gpt.load_model("gpt2", device="cpu")
    ids = torch.tensor([gpt.load_tokenizer().encode("The quick brown fox jumped over the")])
    with torch.no_grad():
        assert (ours(ids, torch.arange(ids.shape[1])[None]) - hf(ids).logits).abs().max() < 1e-3
    assert naive.generate(ours, ids[0].tolist(), 20) == transformers_greedy(hf, ids[0].tolist(), 20, gpt.EOS_TOKEN_ID)
