"""apply_merges remembers each word's tokens in a module-level dict keyed by the word alone: a tokenizer with other
merges (and any later call with other ranks) gets the tokens of the first ranks it was called with."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "two_tokenizers"  # the check that catches it
_module = reference_with(EXERCISE)
_reference_apply_merges = _module.apply_merges
_WORDS = {}


def apply_merges(word, ranks):
    if word not in _WORDS:  # the bug: the key leaves out the ranks
        _WORDS[word] = _reference_apply_merges(word, ranks)
    return list(_WORDS[word])


_module.apply_merges = apply_merges
globals().update(public_names(_module))
