"""The decoder finishes once its text holds the EOS anywhere, the prompt included: a prompt with <|endoftext|>
inside (documents joined, GPT-2's pad id), or one that holds the token given as EOS, ends after one round,
though only the EOS the target produces stops generation."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "differential_decoder"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "SpeculativeDecoder.step", "self.tokens += emitted",
                                                  "self.tokens += emitted\n    self.finished = self.finished or self.eos_token_id in self.tokens")))
