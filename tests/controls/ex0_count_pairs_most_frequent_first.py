"""count_pairs returns its pairs sorted most frequent first (a stable sort, so learn_word_bpe's first-met tie rule
still holds) instead of in the order first met, as its contract says: its dict has the right counts in another order."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0a_differential"  # the check that catches it
_module = reference_with(EXERCISE)
_count = _module.count_pairs


def count_pairs(splits, word_counts):
    counts = _count(splits, word_counts)
    return dict(sorted(counts.items(), key=lambda item: -item[1]))  # the bug: most frequent first


_module.count_pairs = count_pairs
globals().update(public_names(_module))
