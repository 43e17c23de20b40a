"""Naive generate that removes EOS ids from the prompt (taking them for padding) before generating."""

import solutions.ex1_generate as reference
from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"


def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    kept = [t for t in prompt_ids if t != eos_token_id] or list(prompt_ids)  # the bug: <|endoftext|> is text too
    return reference.generate(model, kept, max_new_tokens, eos_token_id)
