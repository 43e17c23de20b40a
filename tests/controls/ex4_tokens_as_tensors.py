"""A continuous batcher whose step() turns the step's tokens into one tensor (to compare them with eos_token_id in
one go) and appends its elements to output_ids: every output holds 0-d tensors, not Python ints. They compare
equal to the right ids, decode() takes them, and the outputs print as numbers inside tensor(...); a client that
json-encodes them, or hashes them as ids, breaks."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine"  # the check that catches it: the control runner runs only that

module = reference_with_edit(EXERCISE, "Engine.step", "now = self.clock()",
                             "next_tokens, now = torch.tensor(next_tokens), self.clock()  # the bug: 0-d tensors from here on")

globals().update(public_names(module))
