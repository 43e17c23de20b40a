"""The draft's fast path for greedy sampling takes the raw argmax whatever the repetition penalty: under
greedy sampling with a penalty its tokens are not its own penalised greedy continuation, nor its q rows the
distributions probabilities() gives. The output stays the target's (verification fixes it); the draft agrees less."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "differential_propose"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "DraftModel.propose", "argmax_only = sampling.greedy and sampling.repetition_penalty == 1",
                                                  "argmax_only = sampling.greedy")))
