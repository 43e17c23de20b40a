"""Word-level BPE that breaks ties by the alphabetically smallest pair instead of the pair met first: the course's
fourth merge becomes l+d instead of o+l (the pairs are counted in sorted order, and max() keeps the first)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "course_worked_example"  # the check that catches it
_module = reference_with(EXERCISE)


def count_pairs(splits, word_counts):
    counts = _module.__dict__["_reference_count_pairs"](splits, word_counts)
    return dict(sorted(counts.items()))  # the bug: the order of first meeting is lost


_module._reference_count_pairs = _module.count_pairs
_module.count_pairs = count_pairs
globals().update(public_names(_module))
