"""accept_greedy keeps a draft token whose logit equals its row's maximum, though another token holds that
maximum too: greedy decoding writes the argmax, the FIRST of the tied tokens, so a draft tied with it but later
in the vocabulary is text the target would not have written. Only exact ties show it (random logits never tie)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "differential_verify"  # the check that catches it


def accept_greedy(draft_tokens, target_logits):
    kept = []
    for i, token in enumerate(draft_tokens):
        if target_logits[i, token] < target_logits[i].max():  # the bug: a tie with the maximum is taken as agreement
            break
        kept.append(token)
    return kept + [int(target_logits[len(kept)].argmax())]


globals().update(public_names(reference_with(EXERCISE, accept_greedy=accept_greedy)))
