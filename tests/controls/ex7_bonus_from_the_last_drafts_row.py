"""When all k drafts are accepted, the bonus token is drawn from target_probs[k - 1] (the row of the last draft)
instead of target_probs[k], the target's distribution after the last draft: right only where the two rows
happen to be equal, as they are when the same p stands at every position."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "differential_accept_sampled"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "accept_sampled", "target_probs[len(draft_tokens)]",
                                                  "target_probs[max(len(draft_tokens) - 1, 0)]")))
