"""Word-level encoding orders the vocabulary by length in CHARACTERS (len(token)) instead of in symbols, so a token
ending with </w> counts 3 too many and goes before longer tokens ("c</w>" before "abc")."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "orders_tokens"  # the check that catches it
_module = reference_with(EXERCISE)


def encode_words(text, vocabulary):
    order = sorted(vocabulary, key=lambda token: (-len(token), -vocabulary[token], token))  # the bug: characters
    tokens = [_module.word_symbols(token) for token in order]
    encoded = []
    for word in text.split():
        encoded += _module._encode_symbols(_module.word_symbols(word + _module.END_OF_WORD), tokens)
    return encoded


_module.encode_words = encode_words
globals().update(public_names(_module))
