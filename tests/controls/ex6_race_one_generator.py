"""The exponential race draws the whole batch's noise [B, V] with ONE generator (the first row's): the
distribution is right, but a request's token depends on its place in the batch and on its neighbours' seeds."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "own_seed"  # the checker's part that catches it


def draw_exponential_race(probs, generators):
    arrival = torch.empty(probs.shape).exponential_(generator=generators[0])  # the bug: one generator for every row
    return (probs / arrival).argmax(dim=1).tolist()


globals().update(public_names(reference_with(EXERCISE, draw_exponential_race=draw_exponential_race)))
