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

    python -m exercises.ex9_tensor_parallel --world-size 2 --prompt "ROMEO:"
    torchrun --nproc-per-node 2 -m exercises.ex9_tensor_parallel --prompt "ROMEO:"

Parts, each graded on its own (pytest exercises/test_ex9_tensor_parallel.py -k 9a):
  9a  sharding: ParallelAttention.__init__ and ParallelMLP.__init__
  9b  the forward with its all-reduces: ParallelAttention.forward and ParallelMLP.forward
  9c  greedy generation with a KV cache per rank: generate
  9d  launching the ranks: launch

Stuck? exercises/hints/ex9.md has hints for each TODO, from the idea to near-code: open one at a time.
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp  # noqa: F401 (for your launch)
import torch.nn.functional as F
from torch import nn

import gpt
from gpt import EOS_TOKEN_ID, check_model_inputs, check_request  # noqa: F401 (check_request: for your generate)

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
        # TODO (exercise 9a): the contract:
        #   - first, before any work: a ValueError (one sentence: what is wrong, what to do) when world_size does
        #     not divide attn.n_head (a rank holds whole heads: with 4 heads, W is 1, 2 or 4; say so), or when rank
        #     is not one of 0..world_size-1.
        #   - this rank keeps, as its own copies (linear_from), 1/W of attn's weights: the q, k and v rows of
        #     c_attn for its n_head / W heads (column-parallel), and the matching input columns of c_proj
        #     (row-parallel). The trap: c_attn's 3C outputs are laid out q, then k, then v, every one C wide and
        #     made of n_head heads; a rank needs q, k AND v of the SAME heads, so cutting the 3C rows into W
        #     contiguous pieces is wrong.
        #   - c_proj's bias must end up added once in the sum over ranks, not W times.
        #   - the module's parameters (or buffers) are everything the rank holds: the checker counts them.
        # forward (9b) will need the number of local heads and their width: keep what you need as attributes.
        raise NotImplementedError("Exercise 9: (part 9a) implement ParallelAttention.__init__ in exercises/ex9_tensor_parallel.py: "
                                  "keep this rank's heads of c_attn (q, k and v alike) and the matching columns of c_proj.")

    def forward(self, x, kv_cache, layer, mask):
        """x: [B, T_new, C], the same on every rank -> the attention output [B, T_new, C], complete (summed over
        the ranks) on every rank. kv_cache holds this rank's heads only."""
        # TODO (exercise 9b): the contract: returns what GPTAttention.forward (with exercise 2's cache) returns
        # for these positions, on every rank. This rank computes q, k, v of its own heads, appends its k, v to
        # kv_cache (exercise 2's KVCache: kv_cache.update(layer, k, v) returns every key and value so far),
        # attends under `mask`, and multiplies by its c_proj: a PARTIAL output. Exactly ONE all-reduce (a sum,
        # torch.distributed) of that [B, T_new, C] partial output completes it; every rank makes the same
        # call, in the same order, or the ranks wait for each other forever.
        raise NotImplementedError("Exercise 9: (part 9b) implement ParallelAttention.forward in exercises/ex9_tensor_parallel.py: "
                                  "attention over this rank's heads, its c_proj, then one all-reduce.")


class ParallelMLP(nn.Module):
    """Rank `rank`'s share of a GPTMLP: 1/world_size of its hidden units."""

    def __init__(self, mlp, rank, world_size):
        super().__init__()
        # TODO (exercise 9a): the contract: this rank keeps, as its own copies, 1/W of mlp's 4C hidden units:
        # c_fc's rows that compute them (column-parallel) and c_proj's columns that read them (row-parallel);
        # c_proj's bias added once in the sum over ranks. (ParallelAttention has already rejected a bad W.)
        raise NotImplementedError("Exercise 9: (part 9a) implement ParallelMLP.__init__ in exercises/ex9_tensor_parallel.py: "
                                  "keep this rank's hidden units: rows of c_fc, the matching columns of c_proj.")

    def forward(self, x):
        """x: [B, T, C], the same on every rank -> the MLP's output [B, T, C], complete on every rank."""
        # TODO (exercise 9b): the contract: returns GPTMLP.forward(x) (gpt.py: GELU with approximate="tanh") on
        # every rank, with exactly ONE all-reduce, of this rank's partial [B, T, C] output.
        raise NotImplementedError("Exercise 9: (part 9b) implement ParallelMLP.forward in exercises/ex9_tensor_parallel.py: "
                                  "this rank's hidden units, its c_proj, then one all-reduce.")


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
    # TODO (exercise 9c): the contract: the same tokens as exercise 2's generate on the whole model (greedy, new
    # tokens only, Python ints, the EOS returned and then no further forward; check_request first), with
    # tp_model(input_ids, position_ids, kv_cache) as the model and one exercise 2 KVCache(n_layer) per call: the
    # prompt once (the prefill), then exactly one token per forward, at its true position. Every rank runs this
    # same loop: a rank that ran one forward more or less than the others would wait in an all-reduce forever.
    raise NotImplementedError("Exercise 9: (part 9c) implement generate() in exercises/ex9_tensor_parallel.py: prefill once, then "
                              "one token per forward of the tensor-parallel model, on every rank alike.")


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
    # TODO (exercise 9d): the contract:
    #   - a ValueError when world_size < 1.
    #   - world_size NEW processes (torch.multiprocessing, start method "spawn": a fork of a process that runs
    #     torch's threads may deadlock), each: one torch thread (W processes share the machine's cores),
    #     torch.distributed.init_process_group(backend) as its rank of world_size, meeting the others at one
    #     address (127.0.0.1 and a free port, the same for all), then fn(rank, world_size, *args); then it leaves
    #     the group.
    #   - returns [rank 0's result, rank 1's, ...]: the results come back to this process, whole, however big
    #     (megabytes: the trap is that a process that has written more than a pipe's buffer, 64 KiB, cannot end
    #     until someone reads it, so a launch that waits for the ranks to end before reading waits forever).
    #   - when a rank raises: raise here, with that rank's own error in the message, and stop the others; never
    #     wait for them (they may be stuck waiting for the failed one, or fail in turn with a connection error
    #     that only echoes the first failure).
    raise NotImplementedError("Exercise 9: (part 9d) implement launch() in exercises/ex9_tensor_parallel.py: start one process per "
                              "rank, join them in a gloo process group, run fn in each, return the results in rank order.")


def generate_on_rank(rank, world_size, model_name, prompt_ids, max_new_tokens, eos_token_id=EOS_TOKEN_ID):
    """What every rank runs for generation: load the model, keep this rank's shard, generate greedily."""
    tp_model = ParallelGPT(gpt.load_model(model_name, device="cpu"), rank, world_size)
    return generate(tp_model, prompt_ids, max_new_tokens, eos_token_id)


def main(argv=None):
    """One command: `python -m exercises.ex9_tensor_parallel --world-size 2` starts the ranks itself;
    under `torchrun --nproc-per-node 2 -m exercises.ex9_tensor_parallel` this process is one of them."""
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
