"""Naive generate that remembers its answers by (prompt, max_new_tokens, eos), forgetting which model gave them:
a second model asked the same question gets the first model's tokens."""

import solutions.ex1_generate as reference
from gpt import EOS_TOKEN_ID

EXERCISE = "ex1_generate"
PART = "test_differential"
_answers = {}


def generate(model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    key = (tuple(prompt_ids), max_new_tokens, eos_token_id)  # the bug: the model is not part of the key
    if key not in _answers:
        _answers[key] = reference.generate(model, prompt_ids, max_new_tokens, eos_token_id)
    return list(_answers[key])
