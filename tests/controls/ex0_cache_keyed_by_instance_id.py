"""The piece cache in a module-level dict keyed by (id(self), piece): right while both tokenizers live, but a
tokenizer made after another was dropped can get the same id(), and then the dropped one's ids."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "two_tokenizers"  # the check that catches it
_module = reference_with(EXERCISE)
_PIECES = {}  # the bug: outlives the tokenizers, and id() values are reused


class ByteLevelBPE(_module.ByteLevelBPE):
    def encode_ordinary(self, text):
        _module._check_text(text)
        ids = []
        for piece in _module.pretokenize(text):
            key = (id(self), piece)
            if key not in _PIECES:
                word = "".join(self.byte_encoder[byte] for byte in piece.encode("utf-8"))
                _PIECES[key] = [self.encoder[token] for token in _module.apply_merges(word, self.ranks)]
            ids += _PIECES[key]
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
