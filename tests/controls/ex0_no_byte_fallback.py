"""No byte fallback: each character of a piece is looked up as one symbol of the 256-symbol base alphabet instead
of as its UTF-8 bytes, so a character beyond it (日, 🙂, —) is dropped and one below it (é) gets the wrong id."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "matches_gpt2_and_tiktoken"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    def encode_ordinary(self, text):
        _module._check_text(text)
        ids = []
        for piece in _module.pretokenize(text):
            word = "".join(self.byte_encoder[ord(char)] for char in piece if ord(char) < 256)  # the bug: characters, not bytes
            ids += [self.encoder[token] for token in _module.apply_merges(word, self.ranks)]
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
