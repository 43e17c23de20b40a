"""The comparison behind the batching checkers (exercises 3 and 4): every request served in a batch
must get the tokens it gets when run alone, up to a near-tie flip (harness.TIE_EPSILON).

"Alone" is the reference KV-cache generate of exercise 2 (solutions/, never the student's).
"""

import functools

import solutions.ex2_kv_cache as alone_reference
from workshop.grading.harness import compare_tokens


@functools.lru_cache(maxsize=4096)
def _alone(model, prompt, max_new_tokens, eos_token_id):
    return tuple(alone_reference.generate(model, list(prompt), max_new_tokens, eos_token_id))


def expected_alone(model, prompt_ids, max_new_tokens, eos_token_id):
    """The request's new tokens when generated alone by the reference of exercise 2 (memoised)."""
    return list(_alone(model, tuple(prompt_ids), max_new_tokens, eos_token_id))


def compare_with_alone(got, model, prompt_ids, max_new_tokens, tokenizer, eos_token_id):
    """None when `got` is what the request gets alone (up to a near-tie flip); else a paragraph saying
    where and how it differs."""
    expected = expected_alone(model, prompt_ids, max_new_tokens, eos_token_id)
    return compare_tokens(got, expected, model, prompt_ids, tokenizer)
