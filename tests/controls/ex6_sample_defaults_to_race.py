"""sample() with draw=None draws by the exponential race instead of draw_multinomial (here an inverse-CDF draw:
a uniform number per row against the cumulative probabilities): the distribution is right, but a seed gives
other tokens than the documented default. (torch's own multinomial on the CPU is the race, so a draw_multinomial
built on it could not show the difference.)"""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6b_sample_draws_with_draw_multinomial_by_default"  # the check that catches it

module = reference_with(EXERCISE)
_sample = module.sample


def draw_multinomial(probs, generators):
    """Inverse CDF: the first token whose cumulative probability passes a uniform draw of the row's generator."""
    tokens = []
    for row, generator in zip(probs, generators):
        u = torch.rand(1, generator=generator, dtype=row.dtype)
        cdf = row.cumsum(0)
        tokens.append(min(int(torch.searchsorted(cdf, u * cdf[-1], right=True)), len(row) - 1))
    return tokens


def sample(logits, params, generators, histories=None, draw=None):
    return _sample(logits, params, generators, histories, draw or module.draw_exponential_race)  # the bug: the wrong default


module.draw_multinomial, module.sample = draw_multinomial, sample
globals().update(public_names(module))
