"""compile_piece compiles run_piece and hands back run_piece itself: every result right, nothing fused."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex12_piecewise_graphs"
PART = "12c"

base = reference_with(EXERCISE)


def compile_piece():
    torch.compile(base.run_piece, fullgraph=True, dynamic=True)  # the bug: the compiled function is dropped
    return base.run_piece


base.compile_piece = compile_piece
globals().update(public_names(base))
