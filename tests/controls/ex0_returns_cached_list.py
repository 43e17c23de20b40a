"""encode_ordinary returns the very list its cache holds when the text is one piece: a caller that appends to the
ids (a prompt, then the generated tokens) changes the cache, and the next encode of that piece is wrong."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "two_tokenizers"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    def encode_ordinary(self, text):
        _module._check_text(text)
        pieces = _module.pretokenize(text)
        ids = []
        for piece in pieces:
            if piece not in self.cache:
                word = "".join(self.byte_encoder[byte] for byte in piece.encode("utf-8"))
                self.cache[piece] = [self.encoder[token] for token in _module.apply_merges(word, self.ranks)]
            ids += self.cache[piece]
        if len(pieces) == 1:
            return self.cache[pieces[0]]  # the bug: the cache's own list, not a copy
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
