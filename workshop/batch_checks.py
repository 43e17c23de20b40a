"""Checks shared by the checkers of exercises 3 and 4 (static and continuous batching): every request
served in a batch must get the tokens it gets when run alone.

"Alone" is the reference KV-cache generate of exercise 2 (solutions/, never the student's). Batched and
single-row forwards add the same numbers in a different order, so float32 logits may differ in the
last bits (about 1e-5 here). Greedy decoding only notices where the two best tokens are nearly tied:
a flip is tolerated there and nowhere else, namely where the reference's logit of its own token
exceeds that of the token that came back by less than TIE_EPSILON.
"""

import functools

import torch

import solutions.ex2_kv_cache as alone_reference
from workshop.harness import describe_token_mismatch

TIE_EPSILON = 1e-3  # logits; ~100x the float32 difference between batched and single-row forwards


@functools.lru_cache(maxsize=4096)
def _alone(model, prompt, max_new_tokens, eos_token_id):
    return tuple(alone_reference.generate(model, list(prompt), max_new_tokens, eos_token_id))


def expected_alone(model, prompt_ids, max_new_tokens, eos_token_id):
    """The request's new tokens when generated alone by the reference of exercise 2 (memoised)."""
    return list(_alone(model, tuple(prompt_ids), max_new_tokens, eos_token_id))


@torch.no_grad()
def logit_gap(model, prefix, preferred, other):
    """How much the model's logit for `preferred` exceeds that for `other` after `prefix` (full fp32 forward)."""
    ids = torch.tensor([prefix], device=model.device)
    logits = model(ids, torch.arange(len(prefix), device=model.device)[None])[0, -1].float()
    return (logits[preferred] - logits[other]).item()


def compare_with_alone(got, model, prompt_ids, max_new_tokens, tokenizer, eos_token_id):
    """None when `got` is what the request gets alone (up to a near-tie flip, see TIE_EPSILON); else a
    paragraph saying where and how it differs."""
    expected = expected_alone(model, prompt_ids, max_new_tokens, eos_token_id)
    problem = describe_token_mismatch(got, expected, tokenizer, prompt_ids)
    if problem is None:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    if i is None:
        return problem  # same tokens, wrong length: stopping is wrong, no rounding explains that
    gap = logit_gap(model, list(prompt_ids) + expected[:i], expected[i], got[i]) if 0 <= got[i] < model.config.vocab_size else float("inf")
    if gap < TIE_EPSILON:
        return None  # a near tie that float rounding may flip: what follows it cannot be compared
    return (f"{problem}\n  Alone, the reference prefers its token over yours by {gap:.3g} logits; a flip is tolerated only "
            f"where that margin is below {TIE_EPSILON} (float rounding), so this is a real difference.")
