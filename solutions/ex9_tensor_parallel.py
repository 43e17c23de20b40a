"""Exercise 9: tensor parallelism, one model split over several processes (Megatron-LM's sharding).

Each of W processes (the "ranks", numbered 0..W-1; W is the world size) holds 1/W of every block's
weights and does 1/W of its matmuls. A block has two pairs of matmuls, and each pair is split the same
way:

  column-parallel first  the layer's OUTPUT features are split: rank r keeps the rows of the weight
                         ([out, in] in nn.Linear) that produce its share of the features, and computes
                         them from the whole input. Nothing to communicate.
  row-parallel second    the layer's INPUT features are split the same way, so rank r multiplies the
                         features it computed by the matching columns of the weight: a PARTIAL sum of
                         the whole output. One all-reduce (a sum over the ranks, delivered to every
                         rank) completes it.

  attention: c_attn (q, k and v) column-parallel BY HEADS, so rank r computes q, k and v of the same
             n_head / W heads and attends with them alone (heads never mix); c_proj row-parallel.
  MLP:       c_fc column-parallel (GELU acts on each hidden unit alone: still nothing to communicate);
             c_proj row-parallel.

So two all-reduces per block, each of a [B, T, C] tensor, and a row-parallel layer's bias is added once
in the sum, not once per rank. The embeddings, layer norms and output layer are replicated: every rank
holds them whole and computes the same numbers, ends with the same logits and picks the same next
token, so no rank has to tell the others which token came out. Each rank's KV cache (exercise 2's,
the reference's) holds only its own heads: 1/W of the KV memory.

The ranks are processes that talk through torch.distributed: gloo on CPU (NCCL on GPUs). One command
starts them, through launch() (torch.multiprocessing) or through torchrun:

    python -m solutions.ex9_tensor_parallel --world-size 2 --prompt "ROMEO:"
    torchrun --nproc-per-node 2 -m solutions.ex9_tensor_parallel --prompt "ROMEO:"
"""

import argparse
import os
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import gpt
from gpt import EOS_TOKEN_ID, check_model_inputs, check_request

# exercise 2's reference, never the student's own
from solutions.ex2_kv_cache import KVCache, causal_mask


def linear_from(weight, bias=None):
    """An nn.Linear holding COPIES of `weight` [out, in] and `bias` [out] (None: no bias).

    A copy, because a slice of a tensor (weight[a:b], weight[:, a:b], .chunk()) is a view that keeps the
    whole matrix in memory: a shard built from views would hold the full model on every rank."""
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


class ParallelAttention(nn.Module):
    """Rank `rank`'s share of a GPTAttention: its n_head / world_size heads."""

    def __init__(self, attn, rank, world_size):
        super().__init__()
        C, n_head = attn.c_proj.out_features, attn.n_head
        if world_size < 1 or n_head % world_size:
            divisors = [w for w in range(1, n_head + 1) if n_head % w == 0]
            raise ValueError(f"world_size={world_size} does not divide the model's {n_head} attention heads: every rank "
                             f"gets n_head / world_size whole heads, so use a world size among {divisors}.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is not one of the {world_size} ranks 0..{world_size - 1}.")
        self.n_head = n_head // world_size  # this rank's heads
        width = C // world_size  # their features: n_head / world_size heads x head_dim
        own = torch.arange(rank * width, (rank + 1) * width, device=attn.c_attn.weight.device)
        rows = torch.cat([own, C + own, 2 * C + own])  # c_attn's output is [q | k | v]: the same heads of each
        self.c_attn = linear_from(attn.c_attn.weight[rows], attn.c_attn.bias[rows])  # column-parallel: C -> 3 x width
        # Row-parallel: this rank's heads' columns; the bias on rank 0 only, so that the sum adds it once.
        self.c_proj = linear_from(attn.c_proj.weight[:, own], attn.c_proj.bias if rank == 0 else None)

    def forward(self, x, kv_cache, layer, mask):
        """x: [B, T_new, C], the same on every rank -> the attention output [B, T_new, C], complete (summed over
        the ranks) on every rank. kv_cache holds this rank's heads only."""
        B, T, _ = x.shape
        width = self.c_proj.in_features
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(B, T, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        k, v = kv_cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.c_proj(y.transpose(1, 2).reshape(B, T, width))  # this rank's heads' share of the output
        dist.all_reduce(y)  # the sum over the ranks, in place, on every rank
        return y


class ParallelMLP(nn.Module):
    """Rank `rank`'s share of a GPTMLP: 1/world_size of its hidden units."""

    def __init__(self, mlp, rank, world_size):
        super().__init__()
        hidden = mlp.c_fc.out_features
        if world_size < 1 or hidden % world_size or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}, world_size={world_size}: the world size must divide the MLP's {hidden} hidden "
                             f"units and the rank be one of 0..world_size-1.")
        width = hidden // world_size
        own = slice(rank * width, (rank + 1) * width)
        self.c_fc = linear_from(mlp.c_fc.weight[own], mlp.c_fc.bias[own])  # column-parallel: C -> width
        self.c_proj = linear_from(mlp.c_proj.weight[:, own], mlp.c_proj.bias if rank == 0 else None)  # row-parallel

    def forward(self, x):
        """x: [B, T, C], the same on every rank -> the MLP's output [B, T, C], complete on every rank."""
        y = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GELU per hidden unit: this rank's are enough
        dist.all_reduce(y)
        return y


class ParallelBlock(nn.Module):
    """A GPTBlock on one rank: layer norms replicated, attention and MLP sharded."""

    def __init__(self, block, rank, world_size):
        super().__init__()
        self.attn = ParallelAttention(block.attn, rank, world_size)  # first: a bad world size fails before any work
        self.mlp = ParallelMLP(block.mlp, rank, world_size)
        self.ln_1, self.ln_2 = block.ln_1, block.ln_2

    def forward(self, x, kv_cache, layer, mask):
        x = x + self.attn(self.ln_1(x), kv_cache, layer, mask)
        return x + self.mlp(self.ln_2(x))


class ParallelGPT(nn.Module):
    """Rank `rank` of `world_size`'s share of a gpt.py model (a GPTLMHead): every block's attention and MLP
    sharded; the embeddings, final layer norm and tied output layer replicated (the model's own modules).

    Building it communicates nothing: the rank and world size are given. Running it does: every rank must
    call forward with the same inputs, in the same order, or the all-reduces wait for each other forever."""

    def __init__(self, model, rank, world_size):
        super().__init__()
        self.config, self.rank, self.world_size = model.config, rank, world_size
        transformer = model.transformer
        self.h = nn.ModuleList(ParallelBlock(block, rank, world_size) for block in transformer.h)
        self.wte, self.wpe, self.ln_f = transformer.wte, transformer.wpe, transformer.ln_f

    @property
    def device(self):
        return self.wte.weight.device

    @torch.no_grad()
    def forward(self, input_ids, position_ids, kv_cache=None):
        """Runs the NEW tokens input_ids [B, T_new] at position_ids [B, T_new]; appends their keys and values
        (this rank's heads) to kv_cache, exercise 2's KVCache(n_layer) (None: a throw-away one, i.e. a plain
        forward); returns the logits [B, T_new, vocab], the same on every rank."""
        # given: ids and positions in range (CPU tensors), checked on every rank alike before any all-reduce starts
        check_model_inputs(self.config, input_ids, position_ids)
        kv_cache = KVCache(self.config.n_layer) if kv_cache is None else kv_cache
        T = input_ids.shape[1]
        mask = causal_mask(T, len(kv_cache) + T, input_ids.device)
        x = self.wte(input_ids) + self.wpe(position_ids)
        for layer, block in enumerate(self.h):
            x = block(x, kv_cache, layer, mask)
        return F.linear(self.ln_f(x), self.wte.weight)  # the output layer, tied to wte as in GPT-2


@torch.no_grad()
def generate(tp_model, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding on one rank of a tensor-parallel model, with a KV cache of this rank's heads.

    Every rank calls it with the same arguments and returns the same new tokens (a list of ints): the
    logits are the same everywhere, so is their argmax, and so is the moment to stop."""
    check_request(prompt_ids, max_new_tokens, tp_model.config.n_positions, tp_model.config.vocab_size)
    kv_cache = KVCache(tp_model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=tp_model.device)
    position_ids = torch.arange(len(prompt_ids), device=tp_model.device)[None]
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = tp_model(input_ids, position_ids, kv_cache)
        next_token = logits[0, -1].argmax()
        new_tokens.append(next_token.item())
        if new_tokens[-1] == eos_token_id:  # every rank sees the same token: all stop at the same step
            break
        input_ids = next_token.view(1, 1)
        position_ids = position_ids[:, -1:] + 1
    return new_tokens


# ----------------------------------------------------------------------------------------------
# Launching: one process per rank, joined by torch.distributed

def free_port():
    """A TCP port of the loopback interface that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn, world_size, *args, backend="gloo"):
    """Run fn(rank, world_size, *args) in `world_size` new processes, one per rank, joined in one
    torch.distributed process group; return their results as a list in rank order.

    fn and args travel to the new processes by pickling: fn must be defined at the top level of a module
    (not in a notebook cell, not a lambda). If a rank raises, launch stops the other ranks (they may be
    waiting for the failed one in a collective, forever) and raises, with the failed rank's traceback."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: launch needs at least one process.")
    context = mp.get_context("spawn")  # a fresh interpreter per rank: never fork a process running torch's threads
    replies, port = context.SimpleQueue(), free_port()
    ranks = [context.Process(target=_run_rank, args=(rank, world_size, port, backend, fn, args, replies), daemon=True)
             for rank in range(world_size)]
    for process in ranks:
        process.start()
    results, failure = {}, None
    try:
        while len(results) < world_size and failure is None:
            if not replies.empty():  # read while they run: a big result would block its rank until read
                rank, ok, value = replies.get()
                if ok:
                    results[rank] = value
                else:
                    failure = f"rank {rank} of {world_size} failed:\n{value}"
            elif any(p.exitcode is not None and i not in results for i, p in enumerate(ranks)) and replies.empty():
                dead = next(i for i, p in enumerate(ranks) if p.exitcode is not None and i not in results)
                failure = f"rank {dead} of {world_size} died (exit code {ranks[dead].exitcode}) without a result."
            else:
                time.sleep(0.01)
    finally:
        for process in ranks:
            if failure is not None:
                process.kill()
            process.join()
    if failure is not None:
        raise RuntimeError(failure)
    return [results[rank] for rank in range(world_size)]


def _run_rank(rank, world_size, port, backend, fn, args, replies):
    """What each new process runs: join the group, run fn, send back (rank, ok, result or traceback)."""
    torch.set_num_threads(1)  # W processes share the machine's cores: one thread each, none oversubscribed
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        replies.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 (whatever it is, the parent reports it)
        replies.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def generate_on_rank(rank, world_size, model_name, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """What every rank runs for generation: load the model, keep this rank's shard, generate greedily."""
    tp_model = ParallelGPT(gpt.load_model(model_name, device="cpu"), rank, world_size)
    return generate(tp_model, prompt_ids, max_new_tokens, eos_token_id)


def main(argv=None):
    """One command: `python -m solutions.ex9_tensor_parallel --world-size 2` starts the ranks itself;
    under `torchrun --nproc-per-node 2 -m solutions.ex9_tensor_parallel` this process is one of them."""
    p = argparse.ArgumentParser(description="Greedy generation with the model split over several processes (tensor parallelism).")
    p.add_argument("--world-size", type=int, default=2, help="processes to split the model over (a divisor of n_head)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    tokenizer = gpt.load_tokenizer()
    prompt_ids = tokenizer.encode(args.prompt)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this process is one rank
        torch.set_num_threads(1)
        dist.init_process_group("gloo")  # torchrun's environment says where the others are
        try:
            tokens = generate_on_rank(dist.get_rank(), dist.get_world_size(), args.model, prompt_ids, args.max_new_tokens)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return tokens
    else:
        tokens = launch(generate_on_rank, args.world_size, args.model, prompt_ids, args.max_new_tokens)[0]
    print(tokenizer.decode(prompt_ids + tokens))
    return tokens


if __name__ == "__main__":
    main()
