"""Merges applied by walking the merge table in its stored (file) order, once, instead of always merging the
pair of lowest rank: right only if the table happens to be stored in rank order."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "lowest_rank_first"  # the check that catches it
_module = reference_with(EXERCISE)


def apply_merges(word, ranks):
    symbols = tuple(word)
    for pair in ranks:  # the bug: the dict's order, not the ranks' values
        symbols = _module.merge_pair(symbols, pair)
    return list(symbols)


_module.apply_merges = apply_merges  # ByteLevelBPE.encode_ordinary calls it through the module
globals().update(public_names(_module))
