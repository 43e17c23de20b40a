"""train_byte_bpe picks max() of the pair counts without checking that a pair is left: a text whose pieces are all
merged whole before the vocabulary is full (or an empty text, or single characters) raises instead of stopping."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0c_differential"  # the check that catches it
_module = reference_with(EXERCISE)


def train_byte_bpe(text, vocab_size):
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: give 256 or more.")
    word_counts = _module.Counter(_module.pretokenize(text))
    byte_encoder = _module.bytes_to_unicode()
    splits = {word: tuple(byte_encoder[byte] for byte in word.encode("utf-8")) for word in word_counts}
    ids = {char: i for i, char in enumerate(sorted(byte_encoder.values()))}
    merges = []
    while len(ids) < vocab_size:
        pairs = _module.count_pairs(splits, word_counts)  # the bug: no `if not pairs: break`
        best = min(pairs, key=lambda pair: (-pairs[pair], ids[pair[0]], ids[pair[1]]))
        merges.append(best)
        ids.setdefault(best[0] + best[1], len(ids))
        splits = {word: _module.merge_pair(symbols, best) for word, symbols in splits.items()}
    return merges


_module.train_byte_bpe = train_byte_bpe
globals().update(public_names(_module))
