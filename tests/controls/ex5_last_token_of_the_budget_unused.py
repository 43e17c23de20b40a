"""Engine.schedule stops scheduling running sequences when one token of the budget is left (budget > 1, an off by
one at the edge): with max_num_batched_tokens equal to the running sequences' decode tokens, the last running
sequence is skipped, and a waiting request may take that token before it. Outputs stay right; decodes starve."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "5c_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "Engine.schedule",
    "while i < len(self.running) and budget:",
    "while i < len(self.running) and budget > 1:  # the bug: the last token of the budget is never a running one's")))
