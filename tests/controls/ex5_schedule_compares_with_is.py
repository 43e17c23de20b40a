"""Engine.schedule walks the running sequences with `i is not len(self.running)`: identity, not equality.
CPython shares the int objects up to 256 only, so past 256 running sequences the loop never ends well (an
IndexError at the end of the list)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_serves_a_batch_past_256_sequences"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "Engine.schedule", "while i < len(self.running) and budget:",
                                                  "while i is not len(self.running) and budget:")))
