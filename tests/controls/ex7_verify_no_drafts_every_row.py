"""verify() with no drafts (k = 0) returns the logits of every token it ran (all the uncached context) instead
of the one row after the context: right whenever one token is uncached, wrong after a prefill."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7b_verify_with_no_drafts"  # the check that catches it

module = reference_with(EXERCISE)


def verify(model, cache, context, draft_tokens):
    logits = module.extend(model, cache, list(context[len(cache):]) + list(draft_tokens))
    return logits[-(len(draft_tokens) + 1):] if draft_tokens else logits  # the bug: k = 0 keeps every row


module.verify = verify
globals().update(public_names(module))
