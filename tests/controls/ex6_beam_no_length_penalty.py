"""Beam search ranks finished hypotheses by their total log-probability, ignoring length_penalty (and
the length normalisation it implies): short hypotheses win."""

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6c"  # the checker's part that catches it


def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=reference.EOS_TOKEN_ID):
    return reference.beam_search(model, prompt_ids, num_beams, max_new_tokens, 0.0, eos_token_id)  # the bug


globals().update(public_names(reference_with(EXERCISE, beam_search=beam_search)))
