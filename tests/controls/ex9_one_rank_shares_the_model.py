"""With world_size=1 a rank holds everything, so ParallelAttention and ParallelMLP keep the model's own c_attn,
c_proj and c_fc modules instead of copies (the stub: "as its own copies (linear_from)"): the logits are right,
but the shard shares its storage with the model it was built from (a change to one is a change to the other)."""

import solutions.ex9_tensor_parallel as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"
PART = "test_differential_9a"  # the check that catches it


class ParallelAttention(reference.ParallelAttention):
    def __init__(self, attn, rank, world_size):
        super().__init__(attn, rank, world_size)
        if world_size == 1:  # the bug: the whole layer, not a copy of it
            self.c_attn, self.c_proj = attn.c_attn, attn.c_proj


class ParallelMLP(reference.ParallelMLP):
    def __init__(self, mlp, rank, world_size):
        super().__init__(mlp, rank, world_size)
        if world_size == 1:
            self.c_fc, self.c_proj = mlp.c_fc, mlp.c_proj


globals().update(public_names(reference_with(EXERCISE, ParallelAttention=ParallelAttention, ParallelMLP=ParallelMLP)))
