"""generate closes a finished answer with EOS even when max_new_tokens is already spent: when the loop stops on
max_new_tokens in a state where EOS is the only token allowed, it appends that EOS anyway ("no forward needed"),
returning max_new_tokens + 1 tokens."""

import torch

import solutions.ex6_constrained as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_constrained"
PART = "test_differential_6e_generate"  # the check that catches it


def generate(model, prompt_ids, constraint, max_new_tokens, sampling=reference.GREEDY):
    tokens = reference.generate(model, prompt_ids, constraint, max_new_tokens, sampling)
    eos = constraint.vocab.eos_token_id
    if tokens and tokens[-1] != eos:  # the bug: the budget is spent, yet a forced EOS is appended
        state = constraint.start()
        for t in tokens:
            state = constraint.advance(state, t)
        allowed = constraint.allowed(state)
        if bool(allowed[eos]) and int(allowed.sum()) == 1:
            tokens.append(eos)
    return tokens


globals().update(public_names(reference_with(EXERCISE, generate=generate)))
_ = torch
