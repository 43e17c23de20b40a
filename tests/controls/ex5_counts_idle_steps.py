"""Engine.step counts a step (and records an empty forward in the stats) even when nothing was scheduled:
the outputs are right, but steps, batch_sizes and scheduled_tokens count iterations that did nothing."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5c_a_step_with_nothing_scheduled_is_no_step"  # the check that catches it


class Engine(reference.Engine):
    def step(self):
        steps = self.stats.steps
        super().step()
        if self.stats.steps == steps:  # the bug: nothing was scheduled, and it is counted as a step anyway
            self.stats.steps += 1
            self.stats.batch_sizes.append(0)
            self.stats.scheduled_tokens.append(0)


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
