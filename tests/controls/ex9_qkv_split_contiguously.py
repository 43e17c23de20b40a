"""c_attn's 3C output rows cut into W contiguous pieces: with W = 2, rank 0 gets q and half of k, rank 1 the
other half of k and v, so a rank's q, k and v are not those of the same heads."""

from torch import nn

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"


class ParallelAttention(reference.ParallelAttention):
    def __init__(self, attn, rank, world_size):
        nn.Module.__init__(self)
        C, n_head = attn.c_proj.out_features, attn.n_head
        if world_size < 1 or n_head % world_size or not 0 <= rank < world_size:
            raise ValueError(f"world_size={world_size} must divide n_head={n_head}, and rank be one of 0..world_size-1.")
        self.n_head, width = n_head // world_size, C // world_size
        rows = slice(rank * 3 * width, (rank + 1) * 3 * width)  # the bug: a contiguous third... of [q | k | v]
        self.c_attn = reference.linear_from(attn.c_attn.weight[rows], attn.c_attn.bias[rows])
        self.c_proj = reference.linear_from(attn.c_proj.weight[:, rank * width:(rank + 1) * width], attn.c_proj.bias if rank == 0 else None)


globals().update(public_names(reference_with(EXERCISE, ParallelAttention=ParallelAttention)))
