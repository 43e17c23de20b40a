"""beam_search never refuses num_beams < 1: asked for 0 or -2 beams, it quietly returns no hypothesis
instead of a ValueError that says what is wrong."""

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6c_bad_beam_search_is_refused"  # the check that catches it


def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=reference.EOS_TOKEN_ID):
    reference.check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    if num_beams < 1:
        return []  # the bug: no ValueError
    return reference.beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty, eos_token_id)


globals().update(public_names(reference_with(EXERCISE, beam_search=beam_search)))
