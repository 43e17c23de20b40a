"""Byte-level training that breaks ties as 0a does (the pair met first in the text) instead of by the smaller ids:
the tokenizers library, and the reference, pick another pair at the first tie."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0c_train_matches_the_reference"  # the check that catches it
_module = reference_with(EXERCISE)


def train_byte_bpe(text, vocab_size):
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: give 256 or more.")
    word_counts = _module.Counter(_module.pretokenize(text))
    byte_encoder = _module.bytes_to_unicode()
    splits = {word: tuple(byte_encoder[b] for b in word.encode("utf-8")) for word in word_counts}
    vocabulary, merges = set(byte_encoder.values()), []
    while len(vocabulary) < vocab_size:
        pairs = _module.count_pairs(splits, word_counts)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)  # the bug: 0a's rule, the first met among equal counts
        merges.append(best)
        vocabulary.add(best[0] + best[1])
        splits = {word: _module.merge_pair(symbols, best) for word, symbols in splits.items()}
    return merges


_module.train_byte_bpe = train_byte_bpe
globals().update(public_names(_module))
