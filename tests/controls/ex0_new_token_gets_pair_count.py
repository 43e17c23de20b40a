"""learn_word_bpe updates its table by the pair's count (the new token gains it, each part loses it), as the old stub
text said, instead of counting the tokens after the merge: wrong where occurrences of the pair overlap (c+c in "ccc"
counts 2 but merges once), so the tables' frequencies drift from the words' symbols."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0a_differential"  # the check that catches it
_module = reference_with(EXERCISE)


def learn_word_bpe(word_counts, num_merges):
    _module.check_word_counts(word_counts, num_merges)
    splits = {word: _module.word_symbols(word) for word in word_counts}
    table = _module._frequencies(splits, word_counts, {})
    initial, steps = dict(table), []
    for _ in range(num_merges):
        pairs = _module.count_pairs(splits, word_counts)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)
        splits = {word: _module.merge_pair(symbols, best) for word, symbols in splits.items()}
        table = dict(table)
        left, right = best
        table[left] -= pairs[best]  # the bug: the pair's count, not the occurrences actually merged
        table[right] -= pairs[best]
        table[left + right] = table.get(left + right, 0) + pairs[best]
        steps.append(_module.MergeStep(best, pairs[best], table))
    return _module.WordBPE(initial, steps, splits)


_module.learn_word_bpe = learn_word_bpe
globals().update(public_names(_module))
