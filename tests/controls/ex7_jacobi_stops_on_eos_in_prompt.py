"""Jacobi decoding that stops once the text holds the EOS anywhere, the prompt included: an EOS id in the
prompt (documents joined by <|endoftext|>, or a word the prompt shares with the text) ends the output after
one forward."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7f_jacobi_stops_right_after_eos"  # the check that catches it

_reference = reference_with(EXERCISE)


@torch.no_grad()
def jacobi_generate(target, prompt_ids, max_new_tokens, n=4, eos_token_id=_reference.EOS_TOKEN_ID):
    _reference.check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    cache, tokens, new_tokens, stats = _reference.KVCache(target.config.n_layer), list(prompt_ids), [], _reference.SpeculativeStats()
    guesses = [tokens[-1]] * n
    while len(new_tokens) < max_new_tokens:
        guesses = guesses[: min(n, max_new_tokens - len(new_tokens) - 1)]
        logits = _reference.verify(target, cache, tokens, guesses)
        emitted = _reference.accept_greedy(guesses, logits)
        _reference.rollback(cache, len(tokens) + len(emitted) - 1)
        predictions = logits.max(dim=-1).indices.tolist()[len(emitted):]
        guesses = predictions + [emitted[-1]] * (n - len(predictions))
        stats.target_forwards += 1
        stats.drafted += len(logits) - 1
        stats.accepted += len(emitted) - 1
        if eos_token_id in emitted:
            emitted = emitted[: emitted.index(eos_token_id) + 1]
        tokens += emitted
        new_tokens += emitted
        stats.generated += len(emitted)
        if eos_token_id in tokens:  # the bug: the prompt's tokens are text, not the target's EOS
            break
    return new_tokens, stats


_reference.jacobi_generate = jacobi_generate
globals().update(public_names(_reference))
