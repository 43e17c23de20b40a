"""sample() draws a token for EVERY row, greedy ones included, then puts the greedy rows' argmax in place:
the tokens are right, but a greedy row's generator moves, so a request's later seeded draws depend on the
greedy steps it took."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6b_a_greedy_row_leaves_its_generator_untouched"  # the check that catches it


def sample(logits, params, generators, histories=None, draw=None):
    if all(p.greedy and p.repetition_penalty == 1 for p in params):
        return logits.argmax(dim=1).tolist()
    logits = filter_logits(logits, params, histories)  # noqa: F821 (the reference copy's, bound at the end)
    tokens = (draw or draw_multinomial)(logits.softmax(dim=1).cpu(), generators)  # noqa: F821 (the bug: every row draws)
    argmax = logits.argmax(dim=1).tolist()
    return [argmax[i] if p.greedy else token for i, (p, token) in enumerate(zip(params, tokens))]


globals().update(public_names(reference_with(EXERCISE, sample=sample)))
