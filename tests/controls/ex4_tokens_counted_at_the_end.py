"""A continuous batcher whose step() does not count its tokens in stats.generated_tokens: run() adds them all up at
the end instead. Every result of run() is right; an engine stepped by hand (as a server steps it) reads 0 generated
tokens between steps, while stats.steps and batch_sizes move on. A counter read between steps, not at the end."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that

module = reference_with_edit(EXERCISE, "Engine.step", "self.stats.generated_tokens += len(next_tokens)",
                             "pass  # the bug: counted once, at the end of run()")
_run = module.Engine.run


def run(self, requests):
    result = _run(self, requests)
    self.stats.generated_tokens = sum(len(seq.output_ids) for seq in self.sequences)
    return result


module.Engine.run = run
globals().update(public_names(module))
