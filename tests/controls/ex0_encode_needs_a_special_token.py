"""encode always cuts the text at its special tokens' alternation, even when the tokenizer has none: the empty
pattern matches everywhere, and encode fails (a KeyError) for a tokenizer made without special tokens."""

import regex

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0b_differential"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    def encode(self, text):
        _module._check_text(text)
        specials = "|".join(regex.escape(token) for token in sorted(self.special_tokens, key=len, reverse=True))
        ids = []  # the bug: no `if not self.special_tokens: return self.encode_ordinary(text)`
        for i, part in enumerate(regex.split(f"({specials})", text)):
            if i % 2:
                ids.append(self.special_tokens[part])
            elif part:
                ids += self.encode_ordinary(part)
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
