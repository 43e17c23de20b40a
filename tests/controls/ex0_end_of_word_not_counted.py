"""Word-level encoding measures a token's length without its </w> (the marker stripped before counting), so
"b</w>" counts 1 instead of 2 and loses to the less frequent "ab"."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "orders_tokens"  # the check that catches it
_module = reference_with(EXERCISE)


def encode_words(text, vocabulary):
    def length(token):
        return len(_module.word_symbols(token.removesuffix(_module.END_OF_WORD)))  # the bug: </w> is one symbol

    order = sorted(vocabulary, key=lambda token: (-length(token), -vocabulary[token], token))
    tokens = [_module.word_symbols(token) for token in order]
    encoded = []
    for word in text.split():
        encoded += _module._encode_symbols(_module.word_symbols(word + _module.END_OF_WORD), tokens)
    return encoded


_module.encode_words = encode_words
globals().update(public_names(_module))
