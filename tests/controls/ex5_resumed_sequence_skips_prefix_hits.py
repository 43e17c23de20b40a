"""Engine.schedule looks prefix hits up only at a sequence's first admission: a preempted sequence resuming
recomputes every token, though the prefix cache still holds its first blocks (its own, freed at the preemption,
or another request's). Outputs stay right; the model computes tokens the cache already has."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "5d_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "Engine.schedule",
    "hits = self.prefix_hits(seq)",
    "hits = self.prefix_hits(seq) if seq.admitted_step < 0 else []  # the bug: a resumed sequence recomputes all")))
