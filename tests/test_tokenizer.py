"""The offline tokenizer is GPT-2's: the ids OpenAI's files give, and a lossless round trip."""

from pathlib import Path

import pytest

import gpt

TRAINING_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def tok():
    return gpt.load_tokenizer()


def test_known_ids(tok):
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("The quick brown fox jumped") == [464, 2068, 7586, 21831, 11687]
    assert tok.encode("<|endoftext|>") == [gpt.EOS_TOKEN_ID] and tok.eos_token_id == gpt.EOS_TOKEN_ID
    assert len(tok) == 50257


def test_round_trip(tok):
    samples = ["First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
               "  leading spaces,\ttabs\r\nand  double  spaces ", "naïve café — 日本語 🙂", "x" * 300]
    card = (gpt.MODELS_DIR / "tiny" / "README.md").read_text()
    if TRAINING_TEXT.exists():  # the real training text, when this checkout sits beside the shared data
        samples.append(TRAINING_TEXT.read_text()[:200_000])
    for text in samples + [card]:
        assert tok.decode(tok.encode(text)) == text


def test_same_ids_as_transformers_gpt2_when_cached(tok):
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache("gpt2", "vocab.json"), str):
        pytest.skip("the hub's gpt2 tokenizer is not cached (run once online to compare)")
    from transformers import AutoTokenizer

    hub = AutoTokenizer.from_pretrained("gpt2")
    text = "Hello world! The quick brown fox jumped over 13 lazy dogs.\n\nnaïve café"
    assert hub.encode(text) == tok.encode(text)
