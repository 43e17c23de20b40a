"""Word-level encoding as a greedy scan from the left, taking the longest token that starts at each position,
instead of replacing the vocabulary's tokens from the longest to the shortest wherever they occur."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "longest_tokens_first"  # the check that catches it
_module = reference_with(EXERCISE)


def encode_words(text, vocabulary):
    tokens = {_module.word_symbols(token) for token in vocabulary}
    longest = max(map(len, tokens), default=0)
    encoded = []
    for word in text.split():
        symbols, i, unknown = _module.word_symbols(word + _module.END_OF_WORD), 0, False
        while i < len(symbols):
            n = next((n for n in range(min(longest, len(symbols) - i), 0, -1) if symbols[i:i + n] in tokens), 0)  # the bug
            if n:
                encoded.append("".join(symbols[i:i + n]))
                i, unknown = i + n, False
            else:
                if not unknown:
                    encoded.append(_module.UNKNOWN)
                i, unknown = i + 1, True
    return encoded


_module.encode_words = encode_words
globals().update(public_names(_module))
