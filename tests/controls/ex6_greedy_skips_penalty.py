"""sample() sends greedy rows straight to the argmax of the raw logits: a greedy request's repetition
penalty is never applied (the processors run for the sampled rows only)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "greedy_rows_take_the_penalised"  # the checker's part that catches it


def sample(logits, params, generators, histories=None, draw=None):
    tokens = logits.argmax(dim=1).tolist()  # the bug: greedy rows skip the processors, the penalty included
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        filtered = filter_logits(logits[rows], [params[i] for i in rows], None if histories is None else [histories[i] for i in rows])
        for i, token in zip(rows, (draw or draw_multinomial)(filtered.softmax(dim=1).cpu(), [generators[i] for i in rows])):
            tokens[i] = token
    return tokens


module = reference_with(EXERCISE, sample=sample)
filter_logits, draw_multinomial = module.filter_logits, module.draw_multinomial
globals().update(public_names(module))
