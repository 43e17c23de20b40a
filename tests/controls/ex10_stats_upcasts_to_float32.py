"""softmax_stats that computes in float32 whatever the rows' dtype ("for stability"): float64 rows come back as
float32 statistics, not in the rows' dtype as the contract says."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex10_attention"
PART = "test_10a_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "softmax_stats", "chunk_max = chunk.amax(dim=-1)", "chunk = chunk.float()\n        chunk_max = chunk.amax(dim=-1)")))
