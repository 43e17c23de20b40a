"""Tensor parallelism (module 9), measured and drawn: shared by bench/tensor_parallel.py,
notebooks/09_tensor_parallel.ipynb and the slides' figures (scripts/make_figures.py, slides/figures/09_*.png).

What runs on the ranks (decode_on_rank, generate_and_count) is a plain function of a module, so that
workshop.distributed.ProcessPool or exercise 9's launch() can start it in other processes. The
sharding picture is read off real shards: for each of a block's four matrices, which rows or columns
of the single-process weight each rank's copy holds (matched by value), whatever the design.
"""

import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from matplotlib.patches import Rectangle

import gpt
from workshop.distributed import CollectiveLog
from workshop.figures.generation import FONT, readable

RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
ALL_REDUCE_COLOR, COMPUTE_COLOR = "tab:red", "#7fb2e5"


# ----------------------------------------------------------------------------------------------
# What each rank runs

def _implementation(module_name):
    import importlib

    return importlib.import_module(module_name)


def generate_and_count(rank, world_size, module_name, model_name, prompt_ids, max_new_tokens):
    """On one rank: the implementation's generate on its shard, with every collective counted. Returns the
    tokens and, per forward, the number of all-reduces and the bytes they carried."""
    impl = _implementation(module_name)
    tp_model = impl.ParallelGPT(gpt.load_model(model_name, device="cpu"), rank, world_size)
    with CollectiveLog() as log:
        tokens = impl.generate(tp_model, list(prompt_ids), max_new_tokens, -1)
    per_forward = 2 * tp_model.config.n_layer
    reduces = log.all_reduces
    forwards = [reduces[i:i + per_forward] for i in range(0, len(reduces), per_forward)]
    return {"tokens": tokens, "all_reduces": len(reduces), "summary": log.summary(),
            "forwards": [{"all_reduces": len(f), "bytes": sum(c.nbytes for c in f)} for f in forwards]}


class _AllReduceClock:
    """Wall-clock time spent inside torch.distributed.all_reduce (the call and its wait), while installed."""

    def __init__(self):
        self.seconds, self.calls, self.bytes = 0.0, 0, 0

    def __enter__(self):
        self._original = dist.all_reduce

        def timed(tensor, *args, **kwargs):
            start = time.perf_counter()
            try:
                return self._original(tensor, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
                self.bytes += tensor.numel() * tensor.element_size()
        dist.all_reduce = timed
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._original


@torch.no_grad()
def decode_on_rank(rank, world_size, module_name, model_name, prompt_ids, new_tokens, single_process=False, warmup=4):
    """One timed greedy run on this rank: the prompt's prefill, then new_tokens decode steps of the
    implementation's ParallelGPT with exercise 2's KV cache. Returns the tokens, every decode step's
    seconds, the seconds inside torch.distributed.all_reduce during them, and the all-reduces' count and
    bytes. single_process: the single-process model itself (exercise 2's forward) instead, communicating nothing."""
    from solutions.ex2_kv_cache import KVCache
    from solutions.ex2_kv_cache import forward as plain_forward

    model = _load(model_name)
    if single_process:
        def forward(ids, positions, cache):
            return plain_forward(model, ids, positions, cache)
    else:
        forward = _sharded(module_name, model_name, rank, world_size)
    for _ in range(warmup + 1):  # the last of these is the measured run
        cache = KVCache(model.config.n_layer)
        ids = torch.tensor([list(prompt_ids)])
        positions = torch.arange(len(prompt_ids))[None]
        tokens, steps, reducing = [], [], []
        logits = forward(ids, positions, cache)  # the prefill, not timed
        with _AllReduceClock() as clock:
            for _ in range(new_tokens):
                next_token = logits[0, -1].argmax()
                tokens.append(int(next_token))
                ids, positions = next_token.view(1, 1), positions[:, -1:] + 1
                start, before = time.perf_counter(), clock.seconds
                logits = forward(ids, positions, cache)
                steps.append(time.perf_counter() - start)
                reducing.append(clock.seconds - before)
    return {"tokens": tokens, "step_seconds": steps, "all_reduce_step_seconds": reducing, "all_reduces": clock.calls,
            "all_reduce_bytes": clock.bytes, "threads": torch.get_num_threads()}


def all_reduce_latency(rank, world_size, n_embd, calls=200):
    """Seconds per all-reduce of one token's activations ([1, 1, n_embd] fp32) among world_size ranks."""
    value = torch.randn(1, 1, n_embd)
    for _ in range(20):
        dist.all_reduce(value)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(value)
    return (time.perf_counter() - start) / calls


_CACHE = {}


def _load(model_name):
    if model_name not in _CACHE:
        _CACHE[model_name] = gpt.load_model(model_name, device="cpu")
    return _CACHE[model_name]


def _sharded(module_name, model_name, rank, world_size):
    key = (module_name, model_name, rank, world_size)
    if key not in _CACHE:
        _CACHE[key] = _implementation(module_name).ParallelGPT(_load(model_name), rank, world_size)
    return _CACHE[key]


def summarize(runs):
    """The median round's numbers, from decode_on_rank results (a list of rounds, each a list of ranks' results): ms per
    token (the median decode step of rank 0), the share of a step inside all-reduce (each rank's median step share,
    averaged over the ranks), all-reduces and payload bytes per token."""
    per_round = []
    for ranks in runs:
        steps = ranks[0]["step_seconds"]
        ms = 1e3 * statistics.median(steps)
        # the share of each step spent inside all-reduce, on each rank; the median step of each, averaged over ranks
        share = statistics.mean(statistics.median(r / s for r, s in zip(rank["all_reduce_step_seconds"], rank["step_seconds"]))
                                for rank in ranks)
        per_round.append({"ms_per_token": ms, "all_reduce_share": share, "all_reduce_ms_per_token": ms * share,
                          "all_reduces_per_token": ranks[0]["all_reduces"] / len(steps),
                          "payload_bytes_per_token": ranks[0]["all_reduce_bytes"] / len(steps)})
    median = sorted(per_round, key=lambda r: r["ms_per_token"])[len(per_round) // 2]
    return {**median, "rounds_ms_per_token": [r["ms_per_token"] for r in per_round]}


def ring_bytes_per_rank(payload_bytes, world_size):
    """Bytes each rank sends for an all-reduce of payload_bytes under a ring all-reduce (reduce-scatter then
    all-gather): 2 (W - 1) / W x the payload; none with one rank."""
    return 2 * (world_size - 1) / world_size * payload_bytes


def communication_per_token(config, world_size, bytes_per_value):
    """All-reduce payload per generated token (2 per block, n_embd values each) and what each rank sends."""
    payload = 2 * config.n_layer * config.n_embd * bytes_per_value
    return {"payload_bytes": payload, "sent_per_rank_bytes": ring_bytes_per_rank(payload, world_size)}


# ----------------------------------------------------------------------------------------------
# The sharding picture, read off real shards

MATRICES = (("attn", "c_attn", "column"), ("attn", "c_proj", "row"), ("mlp", "c_fc", "column"), ("mlp", "c_proj", "row"))


def owners(full_block, shards_block0):
    """For each of a block's four weight matrices ([out, in] as nn.Linear stores them): which rank holds each
    output row (column-parallel) or input column (row-parallel), found by value in the ranks' tensors
    (parameters and buffers of their block 0). Returns {"attn.c_attn": {"split": "column", "shape": (out, in),
    "owner": [rank per row or column], "rank_shapes": [shape of the rank's tensor]}, ...}."""
    found = {}
    for part, name, split in MATRICES:
        weight = getattr(getattr(full_block, part), name).weight.detach()
        lines = weight if split == "column" else weight.t()  # rows or columns of the full matrix
        index = {tuple(line.tolist()): i for i, line in enumerate(lines)}
        owner, rank_shapes = [None] * len(lines), []
        for rank, block in enumerate(shards_block0):
            best = None
            for tensor in list(block.parameters()) + list(block.buffers()):
                if tensor.dim() != 2:
                    continue
                for candidate in (tensor, tensor.t()):
                    if candidate.shape[1] != lines.shape[1]:
                        continue
                    hits = [index.get(tuple(line.tolist())) for line in candidate]
                    if hits and all(h is not None for h in hits) and (best is None or len(hits) > len(best[0])):
                        best = (hits, tuple(tensor.shape))
            if best is not None:
                for h in best[0]:
                    owner[h] = rank
                rank_shapes.append(best[1])
            else:
                rank_shapes.append(None)
        found[f"{part}.{name}"] = {"split": split, "shape": tuple(weight.shape), "owner": owner, "rank_shapes": rank_shapes}
    return found


def plot_sharding(found, config, world_size, width_in=11.5, height_in=4.8):
    """The four matrices of a block in the math layout Y = X A (A = weight transposed, [in, out]), each line
    coloured by the rank that holds it: c_attn and c_fc split by columns (outputs), the two c_proj by rows
    (inputs), each followed by an all-reduce of the partial sums."""
    fig, axes = plt.subplots(1, 4, figsize=(width_in, height_in), gridspec_kw={"width_ratios": [3, 1.2, 4, 1.6]})
    C = config.n_embd
    titles = {"attn.c_attn": "attention c_attn: column-parallel\nby heads (dotted), q, k, v alike",
              "attn.c_proj": "attention c_proj:\nrow-parallel",
              "mlp.c_fc": "MLP c_fc: column-parallel\n(hidden units)", "mlp.c_proj": "MLP c_proj:\nrow-parallel"}
    for ax, (key, info) in zip(axes, found.items()):
        out_features, in_features = info["shape"]
        rows, cols = in_features, out_features  # A = weight.T: [in, out]
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        for i, rank in enumerate(info["owner"]):
            color = RANK_COLORS[rank] if rank is not None else "0.85"
            if info["split"] == "column":
                ax.add_patch(Rectangle((i, 0), 1, rows, color=color, lw=0))
            else:
                ax.add_patch(Rectangle((0, i), cols, 1, color=color, lw=0))
        if key == "attn.c_attn":
            for j, label in enumerate("qkv"):
                if j:
                    ax.axvline(j * C, color="black", lw=2)
                ax.text(j * C + C / 2, rows / 2, label, ha="center", va="center", fontsize=FONT + 6, color="white", weight="bold")
                for h in range(1, config.n_head):
                    ax.axvline(j * C + h * C / config.n_head, color="white", lw=1, ls=":")
        ax.set_aspect("equal")
        ax.set_xticks([0, cols])
        ax.set_yticks([0, rows])
        shapes = "\n".join(f"rank {r}: {list(shape)}" for r, shape in enumerate(info["rank_shapes"]) if shape)
        after = "\n+ all-reduce" if info["split"] == "row" else ""
        ax.set_title(f"{titles[key]}\nA: {rows} x {cols}", fontsize=FONT)
        ax.set_xlabel(f"weight kept:\n{shapes}{after}", fontsize=FONT)
    handles = [Rectangle((0, 0), 1, 1, color=RANK_COLORS[r]) for r in range(world_size)]
    fig.legend(handles, [f"rank {r}" for r in range(world_size)], loc="upper right", fontsize=FONT, ncols=world_size, frameon=False)
    fig.suptitle(f"block 0 of the tiny model over W = {world_size} ranks, as exercise 9 split it (Y = X A, A = weight.T)",
                 fontsize=FONT, x=0.01, ha="left")
    fig.tight_layout()
    return readable(fig)


# ----------------------------------------------------------------------------------------------
# Time per token and communication

def plot_time_per_token(record, width_in=11.0, height_in=4.0):
    """Measured ms per generated token: one process (exercise 2), then W = 1, 2, 4 ranks, with the time
    inside all-reduce stacked in red; and the all-reduce share."""
    data = record["data"]
    labels, compute, reduce = ["1 process\n(no group)"], [data["single_process"]["ms_per_token"]], [0.0]
    for w, row in sorted(data["world_sizes"].items(), key=lambda kv: int(kv[0])):
        labels.append(f"W = {w}")
        reduce.append(row["all_reduce_ms_per_token"])
        compute.append(max(row["ms_per_token"] - row["all_reduce_ms_per_token"], 0.0))
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    x = range(len(labels))
    ax.bar(x, compute, color=COMPUTE_COLOR, label="everything else (the rank's matmuls, attention, output layer)")
    ax.bar(x, reduce, bottom=compute, color=ALL_REDUCE_COLOR, label="inside all-reduce (communication and waiting)")
    for i, (c, r) in enumerate(zip(compute, reduce)):
        share = f"\n{r / (c + r):.0%} all-reduce" if r else ""
        ax.text(i, c + r, f"{c + r:.2f} ms{share}", ha="center", va="bottom", fontsize=FONT)
    ax.set_xticks(list(x), labels, fontsize=FONT)
    ax.set_ylabel("ms per generated token", fontsize=FONT)
    ax.set_ylim(0, max(c + r for c, r in zip(compute, reduce)) * 1.35)
    ax.tick_params(labelsize=FONT)
    ax.legend(fontsize=FONT, loc="upper left", frameon=False)
    meta = record["meta"]
    ax.set_title(f"greedy decode, {data['model']} model, {meta['machine']}, 1 thread per process", fontsize=FONT)
    fig.tight_layout()
    return readable(fig)


def plot_communication(configs, world_sizes=(1, 2, 4, 8), width_in=11.5, height_in=4.2):
    """Per generated token and per rank, against W: the bytes a rank sends (ring all-reduce, 2 per block;
    solid) and the bytes of block weights it reads (1/W of them; dashed), for a few models;
    configs: {label: (GPTConfig, bytes per value)}."""
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    for i, (label, (config, nbytes)) in enumerate(configs.items()):
        color = RANK_COLORS[i]
        sent = [communication_per_token(config, w, nbytes)["sent_per_rank_bytes"] / 1024 for w in world_sizes[1:]]
        weights = [config.n_layer * 12 * config.n_embd ** 2 * nbytes / w / 1024 for w in world_sizes]
        ax.plot(world_sizes[1:], sent, marker="o", color=color, label=f"{label}: sent")
        ax.plot(world_sizes, weights, marker="s", ls="--", color=color, label=f"{label}: block weights read")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(world_sizes, [str(w) for w in world_sizes])
    ax.set_xlabel("world size W (ranks)", fontsize=FONT)
    ax.set_ylabel("bytes per rank per token", fontsize=FONT)
    ax.legend(fontsize=FONT, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ticks = [1, 32, 1024, 32 * 1024, 1024 ** 2, 32 * 1024 ** 2]
    ax.set_yticks(ticks, ["1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB", "32 GiB"])
    ax.set_ylim(1, 32 * 1024 ** 2)
    ax.set_title("one decode step, per rank: the weights it reads shrink as 1/W, the bytes it sends grow", fontsize=FONT)
    fig.tight_layout()
    return readable(fig)
