"""encode treats only GPT-2's "<|endoftext|>" as special (hard-coded) instead of every key of self.special_tokens:
a tokenizer with other special tokens ("<|pad|>", "<|im_start|>") encodes their text as ordinary text."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex0_bpe"
PART = "0b_differential"  # the check that catches it
_module = reference_with(EXERCISE)


class ByteLevelBPE(_module.ByteLevelBPE):
    def encode(self, text):
        _module._check_text(text)
        if _module.END_OF_TEXT not in self.special_tokens:
            return self.encode_ordinary(text)
        ids = []
        for i, part in enumerate(text.split(_module.END_OF_TEXT)):  # the bug: one special token, by name
            if i:
                ids.append(self.special_tokens[_module.END_OF_TEXT])
            ids += self.encode_ordinary(part)
        return ids


_module.ByteLevelBPE = ByteLevelBPE
globals().update(public_names(_module))
