"""accept_sampled with no drafts (k = 0) returns the target's most likely token instead of drawing one from p:
the last round of a sampled request (max_tokens = 1) is greedy."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7c_no_drafts_and_the_generator_only"  # the check that catches it

module = reference_with(EXERCISE)
_accept_sampled = module.accept_sampled


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    if not len(draft_tokens):
        return [int(target_probs[0].argmax())]  # the bug: no draw
    return _accept_sampled(draft_tokens, draft_probs, target_probs, generator)


module.accept_sampled = accept_sampled
globals().update(public_names(module))
