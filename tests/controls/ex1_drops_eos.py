"""Naive generate that stops at EOS but leaves the EOS token out of its output."""

import solutions.ex1_generate as reference
from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"
PART = "test_stops_right_after_eos"  # the check that catches it


def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    tokens = reference.generate(model, prompt_ids, max_new_tokens, eos_token_id)
    return tokens[:-1] if tokens and tokens[-1] == eos_token_id else tokens
