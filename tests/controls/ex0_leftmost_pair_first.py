"""BPE that merges the leftmost pair that has a rank, instead of the pair of lowest rank."""

from itertools import pairwise

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "lowest_rank_first"  # the check that catches it
_module = reference_with(EXERCISE)


def apply_merges(word, ranks):
    symbols = tuple(word)
    while True:
        pair = next((pair for pair in pairwise(symbols) if pair in ranks), None)  # the bug: position, not rank
        if pair is None:
            return list(symbols)
        symbols = _module.merge_pair(symbols, pair)


_module.apply_merges = apply_merges
globals().update(public_names(_module))
