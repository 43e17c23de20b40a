"""Pair counts that ignore the word frequencies: each word's pairs count once, not once per occurrence of the word."""

from itertools import pairwise

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "course_worked_example"  # the check that catches it


def count_pairs(splits, word_counts):
    counts = {}
    for symbols in splits.values():
        for pair in pairwise(symbols):
            counts[pair] = counts.get(pair, 0) + 1  # the bug: not + word_counts[word]
    return counts


globals().update(public_names(reference_with(EXERCISE, count_pairs=count_pairs)))
