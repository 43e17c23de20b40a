"""Engine.schedule sets a sequence's prefix_hit_tokens to the hits of its LATEST admission (= instead of +=): a
sequence preempted and resumed with prefix hits reports only the last admission's, so the sequences' counts no
longer add up to stats.prefix_hit_tokens."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "5d_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "Engine.schedule",
    "seq.prefix_hit_tokens += table.num_tokens",
    "seq.prefix_hit_tokens = table.num_tokens  # the bug: the latest admission's only")))
