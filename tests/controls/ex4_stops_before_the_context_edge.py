"""A continuous batcher that ends a sequence once it is one token short of the model's context ("leave room for
the next position"), an off-by-one guard: the request's last token fits exactly (check_request lets prompt +
max_new_tokens reach n_positions), so a request that fills the context exactly loses its last token. Tiny's
context (512) is never reached by short prompts; a model with a short context and a prompt at its edge shows it."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex4_continuous_batching"
PART = "test_differential_engine or test_differential_generate"  # the checks that catch it (generate at every seed, by a named edge)

module = reference_with_edit(
    EXERCISE, "Engine.step", "len(seq.output_ids) == seq.request.max_new_tokens:",
    "len(seq.output_ids) == seq.request.max_new_tokens or "
    "len(seq.request.prompt_ids) + len(seq.output_ids) >= self.model.config.n_positions - 1:")  # the bug: one short

globals().update(public_names(module))
