"""encode_words splits the text at single spaces (text.split(" ")) instead of at any whitespace: two spaces make an
empty word (a lone </w>), and a tab or newline stays inside a word (an <unk>)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0a_differential"  # the check that catches it
_module = reference_with(EXERCISE)


def encode_words(text, vocabulary):
    order = sorted(vocabulary, key=lambda token: (-len(_module.word_symbols(token)), -vocabulary[token], token))
    tokens = [_module.word_symbols(token) for token in order]
    encoded = []
    for word in text.split(" "):  # the bug: not text.split()
        encoded += _module._encode_symbols(_module.word_symbols(word + _module.END_OF_WORD), tokens)
    return encoded


_module.encode_words = encode_words
globals().update(public_names(_module))
