"""Jacobi decoding that never takes its next guesses from the forward's predictions: every round it
guesses the last accepted token n times over. The output is still exactly greedy (the target verifies
every guess), but a guess comes true only where the text repeats a token, so almost every forward yields
one token: no speed-up at all."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "jacobi_guesses_from_predictions"  # the checker's check that catches it

_reference = reference_with(EXERCISE)


@torch.no_grad()
def jacobi_generate(target, prompt_ids, max_new_tokens, n=4, eos_token_id=_reference.EOS_TOKEN_ID):
    _reference.check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    cache, tokens, new_tokens, stats = _reference.KVCache(target.config.n_layer), list(prompt_ids), [], _reference.SpeculativeStats()
    while len(new_tokens) < max_new_tokens:
        guesses = [tokens[-1]] * min(n, max_new_tokens - len(new_tokens) - 1)  # the bug: the predictions are thrown away
        logits = _reference.verify(target, cache, tokens, guesses)
        emitted = _reference.accept_greedy(guesses, logits)
        _reference.rollback(cache, len(tokens) + len(emitted) - 1)
        stats.target_forwards += 1
        stats.drafted += len(guesses)
        stats.accepted += len(emitted) - 1
        if eos_token_id in emitted:
            emitted = emitted[: emitted.index(eos_token_id) + 1]
        tokens += emitted
        new_tokens += emitted
        stats.generated += len(emitted)
        if eos_token_id in emitted:
            break
    return new_tokens, stats


_reference.jacobi_generate = jacobi_generate
globals().update(public_names(_reference))
