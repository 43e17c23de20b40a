"""The processors in the wrong order: top-p and min-p cut the distribution BEFORE the temperature
reshapes it, so they cut by the wrong probabilities."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6b"  # the checker's part that catches it


def filter_logits(logits, params, histories=None):
    logits = logits.float()
    if any(p.repetition_penalty != 1 for p in params):
        logits = apply_repetition_penalty(logits, histories, [p.repetition_penalty for p in params])
    logits = apply_top_k(logits, [p.top_k for p in params])
    logits = apply_top_p(logits, [p.top_p for p in params])  # the bug: before the temperature
    logits = apply_min_p(logits, [p.min_p for p in params])
    return apply_temperature(logits, [p.temperature for p in params])


module = reference_with(EXERCISE, filter_logits=filter_logits)
apply_repetition_penalty, apply_top_k, apply_top_p = module.apply_repetition_penalty, module.apply_top_k, module.apply_top_p
apply_min_p, apply_temperature = module.apply_min_p, module.apply_temperature
globals().update(public_names(module))
