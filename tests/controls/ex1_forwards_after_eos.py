"""Naive generate that always runs max_new_tokens forward passes, then cuts its output after the first EOS:
the right tokens, but wasted work after the end."""

import solutions.ex1_generate as reference
from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"
PART = "test_stops_right_after_eos"  # the check that catches it


def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    tokens = reference.generate(model, prompt_ids, max_new_tokens, eos_token_id=-1)  # the bug: never stops early
    return tokens[: tokens.index(eos_token_id) + 1] if eos_token_id in tokens else tokens
