"""learn_word_bpe returns the splits as they were BEFORE the last merge (the loop keeps the previous splits to diff
the table against, and returns the wrong one): the merges, counts and tables are right, WordBPE.splits is stale."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0a_differential"  # the check that catches it
_module = reference_with(EXERCISE)


def learn_word_bpe(word_counts, num_merges):
    _module.check_word_counts(word_counts, num_merges)
    splits = {word: _module.word_symbols(word) for word in word_counts}
    previous = splits
    table = _module._frequencies(splits, word_counts, {})
    initial, steps = dict(table), []
    for _ in range(num_merges):
        pairs = _module.count_pairs(splits, word_counts)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)
        previous, splits = splits, {word: _module.merge_pair(symbols, best) for word, symbols in splits.items()}
        table = _module._frequencies(splits, word_counts, table)
        steps.append(_module.MergeStep(best, pairs[best], table))
    return _module.WordBPE(initial, steps, previous)  # the bug: the splits before the last merge


_module.learn_word_bpe = learn_word_bpe
globals().update(public_names(_module))
