"""MergeStep.count records the new token's frequency after the merge instead of the pair's count when it was chosen:
the same number unless occurrences of the pair overlap (a+a in "aaaa" counts 3 but merges twice)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0a_differential"  # the check that catches it
_module = reference_with(EXERCISE)
_learn = _module.learn_word_bpe


def learn_word_bpe(word_counts, num_merges):
    learned = _learn(word_counts, num_merges)
    for step in learned.steps:
        step.count = step.table[step.pair[0] + step.pair[1]]  # the bug: the count after the merge
    return learned


_module.learn_word_bpe = learn_word_bpe
globals().update(public_names(_module))
