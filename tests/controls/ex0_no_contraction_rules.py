"""GPT-2's pre-tokenization regex without its contraction rules ('s 't 're 've 'm 'll 'd): "don't" splits as
"don", "'", "t" instead of "don", "'t", and the ids change."""

import regex

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "pretokenize_splits"  # the check that catches it
_PATTERN = regex.compile(r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")  # the bug: no 's|'t|'re|'ve|'m|'ll|'d


def pretokenize(text):
    return _PATTERN.findall(text)


globals().update(public_names(reference_with(EXERCISE, pretokenize=pretokenize)))
