"""beam_search with num_beams = 1 takes a greedy shortcut and scores its one hypothesis total / len(tokens),
whatever length_penalty is: the tokens are right (one beam is greedy), the score is not, for any
length_penalty other than 1."""

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_differential_6c_beam_search"  # the check that catches it


def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=reference.EOS_TOKEN_ID):
    if num_beams == 1:  # the bug: the shortcut forgets length_penalty
        found = reference.beam_search(model, prompt_ids, 1, max_new_tokens, length_penalty, eos_token_id)
        h = found[0]
        total = h.score * len(h.tokens) ** length_penalty
        return [reference.Hypothesis(h.tokens, total / len(h.tokens))]
    return reference.beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty, eos_token_id)


globals().update(public_names(reference_with(EXERCISE, beam_search=beam_search)))
