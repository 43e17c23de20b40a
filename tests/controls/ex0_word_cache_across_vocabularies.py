"""encode_words remembers each word's tokens in a module-level dict keyed by the word alone: a call with another
vocabulary gets the tokens of the first vocabulary that encoded the word."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "two_vocabularies"  # the check that catches it
_module = reference_with(EXERCISE)
_reference_encode_words = _module.encode_words
_WORDS = {}


def encode_words(text, vocabulary):
    tokens = []
    for word in text.split():
        if word not in _WORDS:  # the bug: the key leaves out the vocabulary
            _WORDS[word] = _reference_encode_words(word, vocabulary)
        tokens += _WORDS[word]
    return tokens


_module.encode_words = encode_words
globals().update(public_names(_module))
