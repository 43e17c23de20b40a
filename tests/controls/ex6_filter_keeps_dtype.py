"""filter_logits filters the logits in the dtype they come in: fp16 or bf16 logits (an engine's on a GPU) come
back in that dtype, filtered with half-precision probabilities, instead of as float32."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6b_filter_logits_returns_float32_for_any_float_dtype"  # the check that catches it


def filter_logits(logits, params, histories=None):
    # the bug: no logits.float() first
    if any(p.repetition_penalty != 1 for p in params):
        logits = apply_repetition_penalty(logits, histories, [p.repetition_penalty for p in params])  # noqa: F821
    logits = apply_temperature(logits, [p.temperature for p in params])  # noqa: F821
    if any(0 < p.top_k < logits.shape[1] for p in params):
        logits = apply_top_k(logits, [p.top_k for p in params])  # noqa: F821
    if any(p.top_p < 1 for p in params):
        logits = apply_top_p(logits, [p.top_p for p in params])  # noqa: F821
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, [p.min_p for p in params])  # noqa: F821
    return logits


globals().update(public_names(reference_with(EXERCISE, filter_logits=filter_logits)))
