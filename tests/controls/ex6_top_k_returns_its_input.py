"""apply_top_k hands back the very tensor it was given when no row filters anything (every k is 0 or >= V): the
values are right, but the "new logits" share their storage with the caller's, so a later in-place change to one
(a masked_fill_ by the next processor, say) changes the other."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_differential_6a_processors"  # the check that catches it


def apply_top_k(logits, top_ks):
    import torch

    vocab = logits.shape[1]
    k = torch.as_tensor(top_ks, dtype=torch.long, device=logits.device).view(-1, 1)
    k = torch.where((k <= 0) | (k > vocab), vocab, k)
    if bool((k == vocab).all()):
        return logits  # the bug: nothing to filter, the input itself comes back
    kth_largest = logits.topk(int(k.max()), dim=1).values.gather(1, k - 1)
    return logits.masked_fill(logits < kth_largest, FILTERED)  # noqa: F821 (the reference copy's, bound at the end)


globals().update(public_names(reference_with(EXERCISE, apply_top_k=apply_top_k)))
