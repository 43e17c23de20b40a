"""A different CORRECT design for exercise 9, which its checker must accept: rank r owns the strided heads
r, r + W, r + 2W, ... and the strided hidden units r, r + W, ... (not contiguous blocks); the weights are
buffers used through F.linear (no nn.Linear); the row-parallel biases are held by every rank and added
after the all-reduce; attention is written out (softmax of masked scores, no SDPA); the all-reduces go
through torch's functional collectives and the process group's own allreduce (not dist.all_reduce);
generate takes each position from the cache's length; launch uses torch.multiprocessing.spawn with
env:// rendezvous and hands the results back through files.

    pytest exercises/test_ex9_tensor_parallel.py --impl solutions --replace ex9_tensor_parallel=tests.alternatives.ex9_strided_heads
"""

import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache
from tests.control_support import public_names, reference_with

EXERCISE = "ex9_tensor_parallel"


def _strided(n_units, unit_size, rank, world_size):
    """Feature indices of the units rank, rank + W, ... (each unit_size features wide)."""
    units = torch.arange(rank, n_units, world_size)
    return (units[:, None] * unit_size + torch.arange(unit_size)[None, :]).flatten()


class ParallelAttention(nn.Module):
    def __init__(self, attn, rank, world_size):
        super().__init__()
        n_head, C = attn.n_head, attn.c_attn.in_features
        if world_size <= 0 or n_head % world_size != 0:
            raise ValueError(f"n_head={n_head} is not divisible by world_size={world_size}; choose a divisor of {n_head}.")
        if rank not in range(world_size):
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}.")
        self.heads, self.head_dim = n_head // world_size, C // n_head
        own = _strided(n_head, self.head_dim, rank, world_size)
        rows = torch.cat([own + i * C for i in range(3)])
        self.register_buffer("qkv_weight", attn.c_attn.weight[rows].clone())
        self.register_buffer("qkv_bias", attn.c_attn.bias[rows].clone())
        self.register_buffer("proj_weight", attn.c_proj.weight[:, own].clone())
        self.register_buffer("proj_bias", attn.c_proj.bias.clone())  # every rank: added after the sum

    def forward(self, x, kv_cache, layer, mask):
        B, T, _ = x.shape
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias).view(B, T, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, T, head_dim]
        k, v = kv_cache.update(layer, k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        import torch.distributed._functional_collectives as funcol  # here: importing it costs a second (torch._dynamo)

        y = funcol.all_reduce(F.linear(y, self.proj_weight), "sum", dist.group.WORLD)
        return y + self.proj_bias


class ParallelMLP(nn.Module):
    def __init__(self, mlp, rank, world_size):
        super().__init__()
        own = _strided(mlp.c_fc.out_features, 1, rank, world_size)
        self.register_buffer("fc_weight", mlp.c_fc.weight[own].clone())
        self.register_buffer("fc_bias", mlp.c_fc.bias[own].clone())
        self.register_buffer("proj_weight", mlp.c_proj.weight[:, own].clone())
        self.register_buffer("proj_bias", mlp.c_proj.bias.clone())

    def forward(self, x):
        y = F.linear(F.gelu(F.linear(x, self.fc_weight, self.fc_bias), approximate="tanh"), self.proj_weight)
        dist.group.WORLD.allreduce([y]).wait()
        return y + self.proj_bias


@torch.no_grad()
def generate(tp_model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    check_request(prompt_ids, max_new_tokens, tp_model.config.n_positions, tp_model.config.vocab_size)
    cache, tokens, new = KVCache(tp_model.config.n_layer), list(prompt_ids), []
    while len(new) < max_new_tokens and (not new or new[-1] != eos_token_id):
        start = len(cache)
        ids = torch.tensor([tokens[start:]])
        logits = tp_model(ids, torch.arange(start, len(tokens))[None], cache)
        new.append(int(logits[0, -1].argmax()))
        tokens.append(new[-1])
    return new


def _entry(rank, world_size, folder, backend, fn, args):
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group(backend, init_method="env://")
    try:
        torch.save(fn(rank, world_size, *args), os.path.join(folder, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(fn, world_size, *args, backend="gloo"):
    if world_size < 1:
        raise ValueError("world_size must be at least 1.")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # noqa: F821 (from the reference's copy)
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_entry, args=(world_size, folder, backend, fn, args), nprocs=world_size, join=True)  # raises if a rank failed
        return [torch.load(os.path.join(folder, f"{rank}.pt"), weights_only=False) for rank in range(world_size)]


_replaced = {"ParallelAttention": ParallelAttention, "ParallelMLP": ParallelMLP, "generate": generate, "launch": launch}
globals().update({name: value for name, value in public_names(reference_with(EXERCISE, **_replaced)).items() if name not in _replaced})
