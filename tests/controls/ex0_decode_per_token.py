"""Decoding each token's bytes on its own: a character whose bytes lie in two tokens (most emoji, many CJK
characters) comes back as two U+FFFD instead of itself."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "decode_gives_the_text_back"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    def decode(self, ids):
        self._check_ids(ids)
        special = {i: token for token, i in self.special_tokens.items()}
        return "".join(special[i] if i in special else bytes(self.byte_decoder[c] for c in self.decoder[i]).decode("utf-8", "replace")
                       for i in ids)  # the bug: one decode per token


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
