"""The piece cache held by the class instead of each tokenizer (a class attribute, as a module-level dict would be):
a second tokenizer with other merges or ids gets the first one's ids for every piece the first has seen."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "two_tokenizers"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    pieces = {}  # the bug: one dict for every tokenizer

    def encode_ordinary(self, text):
        _module._check_text(text)
        ids = []
        for piece in _module.pretokenize(text):
            if piece not in ByteLevelBPE.pieces:
                word = "".join(self.byte_encoder[byte] for byte in piece.encode("utf-8"))
                ByteLevelBPE.pieces[piece] = [self.encoder[token] for token in _module.apply_merges(word, self.ranks)]
            ids += ByteLevelBPE.pieces[piece]
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
