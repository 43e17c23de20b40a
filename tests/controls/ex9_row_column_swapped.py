"""The MLP's split swapped: c_fc row-parallel (each rank a slice of its INPUT features) and c_proj column-
parallel (a slice of its outputs, gathered by an all-reduce of zero-padded pieces), so GELU acts on partial
sums of c_fc's output instead of on complete ones."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"


class ParallelMLP(reference.ParallelMLP):
    def __init__(self, mlp, rank, world_size):
        nn.Module.__init__(self)
        C = mlp.c_proj.out_features
        width = C // world_size
        self.own = slice(rank * width, (rank + 1) * width)
        # the bug: c_fc split along its inputs, c_proj along its outputs
        self.c_fc = reference.linear_from(mlp.c_fc.weight[:, self.own], mlp.c_fc.bias if rank == 0 else None)
        self.c_proj = reference.linear_from(mlp.c_proj.weight[self.own], mlp.c_proj.bias[self.own])

    def forward(self, x):
        piece = self.c_proj(F.gelu(self.c_fc(x[..., self.own]), approximate="tanh"))  # GELU of a partial sum
        y = torch.zeros_like(x)
        y[..., self.own] = piece
        dist.all_reduce(y)  # gathers the output pieces
        return y


globals().update(public_names(reference_with(EXERCISE, ParallelMLP=ParallelMLP)))
