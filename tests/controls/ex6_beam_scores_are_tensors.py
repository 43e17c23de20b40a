"""beam_search scores its hypotheses with 0-d tensors (the total kept as the tensor topk gave) instead of Python
floats: printing, sorting and torch.tensor([h.score ...]) still work, but Hypothesis.score is a float by its
contract (json.dumps of a result fails, and each score holds on to a tensor)."""

import torch

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_differential_6c_beam_search"  # the check that catches it


def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=reference.EOS_TOKEN_ID):
    found = reference.beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty, eos_token_id)
    return [reference.Hypothesis(h.tokens, torch.tensor(h.score)) for h in found]  # the bug: a tensor score


globals().update(public_names(reference_with(EXERCISE, beam_search=beam_search)))
