"""Attention kernels (module 10), drawn: shared by notebooks/10_attention.ipynb and the slides' figures
(scripts/make_figures.py, slides/figures/10_*.png). Every picture of a kernel is drawn from what the
implementation under test did (the tiles it loaded, the statistics it returned), never redrawn by hand.
"""

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch, Rectangle

from workshop import attention as memory
from workshop.figures.generation import FONT, readable

FULL, MASKED, SKIPPED, CHUNK_COLOURS = "#1f77b4", "#ff7f0e", "#e8e8e8", ["#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#8c564b"]

# The FlashAttention paper's Figure 1 (Dao et al., 2022): an A100's memory hierarchy, bandwidth and size.
HIERARCHY = [("GPU SRAM (on chip)", 19e12, "20 MB"), ("GPU HBM", 1.5e12, "40 GB"), ("CPU DRAM", 12.8e9, "> 1 TB")]


class TracingHBM(memory.HBM):
    """An HBM that also records every load: (name, start, stop)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace = []

    def load(self, name, start, stop):
        self.trace.append((name, start, stop))
        return super().load(name, start, stop)


def trace_tiles(ex10, Tq, Tk, block_q, block_k, d=8, seed=0):
    """Run ex10.flash_attention on random inputs; return, per query tile, the key tiles it loaded, and the output's
    largest difference from SDPA."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, t, d, generator=g) for t in (Tq, Tk, Tk))
    hbm = TracingHBM(q, k, v, causal=True)
    ex10.flash_attention(hbm, block_q, block_k)
    loaded, current = {}, None
    for name, start, stop in hbm.trace:
        if name == "q":
            current = start
        elif name == "k":
            loaded.setdefault(current, []).append(start)
    error = (hbm.output - torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=memory.lower_right_mask(Tq, Tk))).abs().max()
    return {"Tq": Tq, "Tk": Tk, "block_q": block_q, "block_k": block_k, "loaded": loaded, "max_error": float(error),
            "bytes": hbm.bytes_moved}


def plot_tiles(traces, titles):
    """Each trace as a grid of (query tile, key tile): loaded in full, loaded and masked inside (crosses the
    diagonal), or skipped; the lower-right diagonal drawn over it."""
    fig, axes = plt.subplots(1, len(traces), figsize=(11.5, 4.6), gridspec_kw={"width_ratios": [t["Tk"] for t in traces]})
    for ax, t, title in zip(axes, traces, titles):
        Tq, Tk, bq, bk, offset = t["Tq"], t["Tk"], t["block_q"], t["block_k"], t["Tk"] - t["Tq"]
        for i0 in range(0, Tq, bq):
            i1 = min(i0 + bq, Tq)
            for j0 in range(0, Tk, bk):
                j1 = min(j0 + bk, Tk)
                loaded = j0 in t["loaded"].get(i0, [])
                colour = (MASKED if j1 - 1 > offset + i0 else FULL) if loaded else SKIPPED
                ax.add_patch(Rectangle((j0, i0), j1 - j0, i1 - i0, facecolor=colour, edgecolor="white", linewidth=2))
        ax.plot([offset, Tk], [0, Tq], color="black", linewidth=2)  # query i sees keys up to offset + i
        ax.set_xlim(0, Tk), ax.set_ylim(Tq, 0), ax.set_aspect("equal")
        ax.set_xlabel("key position"), ax.set_ylabel("query (row)")
        ax.set_title(title, fontsize=FONT)
    fig.legend(handles=[Patch(color=FULL, label="loaded"), Patch(color=MASKED, label="loaded, masked inside"),
                        Patch(facecolor=SKIPPED, edgecolor="grey", label="skipped: never loaded")],
               loc="lower center", ncol=3, fontsize=FONT, frameon=False)
    readable(fig)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def running_stats(ex10, row, chunk):
    """The running max and sum after each chunk, from ex10.softmax_stats on the first c chunks."""
    chunks = row[None].split(chunk, dim=-1)
    stats = [ex10.softmax_stats(iter(chunks[:c + 1])) for c in range(len(chunks))]
    return [float(m[0]) for m, _ in stats], [float(l[0]) for _, l in stats]


def plot_online_softmax(ex10, row, chunk):
    """A row of scores read chunk by chunk: the running max m (steps) and the running sum l (relative to
    that m), with the rescale factor exp(m_old - m_new) wherever a chunk raised the max."""
    maxes, sums = running_stats(ex10, row, chunk)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.2))
    n = len(row)
    left.bar(range(n), row.tolist(), color=[CHUNK_COLOURS[(i // chunk) % len(CHUNK_COLOURS)] for i in range(n)])
    for c, m in enumerate(maxes):
        left.hlines(m, c * chunk - 0.5, min(n, (c + 1) * chunk) - 0.5, color="black", linewidth=2.5)
    left.set_xlabel("score index (a colour per chunk)"), left.set_ylabel("score")
    left.set_title("black: the max so far, m", fontsize=FONT)
    right.plot(range(1, len(sums) + 1), sums, marker="o", color="black")
    for c in range(1, len(maxes)):
        if maxes[c] > maxes[c - 1]:
            right.annotate(f"x exp({maxes[c - 1]:.1f} - {maxes[c]:.1f})", (c + 1, sums[c]), textcoords="offset points",
                           xytext=(8, -4), fontsize=FONT - 1)
    right.set_xlabel("chunks read"), right.set_ylabel("l = sum exp(x - m)")
    right.set_xticks(range(1, len(sums) + 1))
    right.set_title("the sum so far, rescaled when m grows", fontsize=FONT)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_memory_hierarchy():
    fig, ax = plt.subplots(figsize=(11.5, 3.2))
    names = [h[0] for h in HIERARCHY]
    ax.barh(names, [h[1] / 1e9 for h in HIERARCHY], color=["#2ca02c", "#1f77b4", "#7f7f7f"])
    for i, (_, bandwidth, size) in enumerate(HIERARCHY):
        ax.text(bandwidth / 1e9 * 1.15, i, f"{bandwidth / 1e12:g} TB/s, {size}" if bandwidth >= 1e12 else f"{bandwidth / 1e9:g} GB/s, {size}",
                va="center", fontsize=FONT)
    ax.set_xscale("log"), ax.set_xlim(1, 3e5), ax.invert_yaxis()
    ax.set_xlabel("bandwidth, GB/s (log scale); A100, FlashAttention paper, Figure 1")
    readable(fig)
    fig.tight_layout()
    return fig


def plot_bytes_and_time(record):
    """Left: bytes one causal attention call moves, standard vs FlashAttention, as T grows (counted or by the
    formula). Right: CPU time of SDPA, the standard path and the plain-PyTorch tiles."""
    data = record["data"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    lengths = sorted(int(t) for t in data["bytes"])
    for key, label, colour in (("standard_bytes", "standard (T x T scores in HBM)", "#d62728"), ("flash_bytes", "FlashAttention", FULL),
                               ("qkvo_bytes", "Q, K, V, O once (the floor)", "#7f7f7f")):
        left.plot(lengths, [data["bytes"][str(t)][key] / 2**20 for t in lengths], marker="o", label=label, color=colour)
    left.set_xscale("log", base=2), left.set_yscale("log")
    left.set_xlabel("sequence length T"), left.set_ylabel("MiB moved (fp32)")
    left.set_title(f"{data['heads']} heads of {data['head_dim']}, tiles of {data['block']}", fontsize=FONT)
    left.legend(fontsize=FONT - 1, frameon=False)
    prefill = data["cpu_prefill"]
    lengths = sorted(int(t) for t in prefill)
    for key, label, colour in (("sdpa_ms", "SDPA (fused C++)", "#2ca02c"), ("standard_ms", "standard, 3 steps", "#d62728"),
                               ("flash_tiles_ms", "FlashAttention, PyTorch tiles", FULL)):
        right.plot(lengths, [prefill[str(t)][key] for t in lengths], marker="o", label=label, color=colour)
    right.set_xscale("log", base=2), right.set_yscale("log")
    right.set_xlabel("sequence length T"), right.set_ylabel("ms per call, CPU")
    right.set_title(f"one thread, median of {record['meta']['repeats']}", fontsize=FONT)
    right.legend(fontsize=FONT - 1, frameon=False)
    readable(fig)
    fig.tight_layout()
    return fig


def split_kv_example(ex10, length=45, block_size=4, blocks_per_chunk=3, H=1, d=8, seed=3):
    """A sequence in a scattered block table, split into chunks of blocks: each chunk's lse and its weight in the
    merge (from ex10.merge_partials), against its share of the keys."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = -(-length // block_size)
    table = torch.randperm(2 * n_blocks, generator=g)[:n_blocks].tolist()
    q, k, v = torch.randn(1, H, 1, d, generator=g), torch.randn(1, H, length, d, generator=g) * 1.5, torch.randn(1, H, length, d, generator=g)
    chunk = blocks_per_chunk * block_size
    outputs, lses, sizes = [], [], []
    for start in range(0, length, chunk):
        s = q @ k[:, :, start:start + chunk].transpose(-1, -2) / math.sqrt(d)
        outputs.append(torch.softmax(s, -1) @ v[:, :, start:start + chunk])
        lses.append(torch.logsumexp(s, -1))
        sizes.append(s.shape[-1])
    lses_t = torch.stack(lses)
    merged, lse = ex10.merge_partials(torch.stack(outputs), lses_t)
    weights = torch.exp(lses_t - lse).flatten().tolist()
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return {"length": length, "block_size": block_size, "blocks_per_chunk": blocks_per_chunk, "table": table,
            "lses": lses_t.flatten().tolist(), "weights": weights, "sizes": sizes, "lse": float(lse.flatten()[0]),
            "max_error": float((merged - whole).abs().max())}


def plot_split_kv(example):
    """Top: the block table, each logical block coloured by its chunk (the last block part-filled). Bottom: each
    chunk's weight in the merge, exp(lse_c - lse), against its share of the keys."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11.5, 4.7), gridspec_kw={"height_ratios": [1, 1.7]})
    bs, per, length = example["block_size"], example["blocks_per_chunk"], example["length"]
    for i, block in enumerate(example["table"]):
        c = i // per
        filled = min(bs, length - i * bs)
        top.add_patch(Rectangle((i, 0), 1, 1, facecolor=CHUNK_COLOURS[c % len(CHUNK_COLOURS)], edgecolor="white", linewidth=2, alpha=0.85))
        if filled < bs:  # the unused slots of the last block: never read
            top.add_patch(Rectangle((i + filled / bs, 0), 1 - filled / bs, 1, facecolor="white", edgecolor="black", hatch="//", linewidth=1))
        top.text(i + 0.5, 0.5, str(block), ha="center", va="center", color="white" if filled == bs else "black", fontsize=FONT,
                 weight="bold", bbox=None if filled == bs else {"facecolor": "white", "edgecolor": "none"})
    top.set_xlim(0, len(example["table"])), top.set_ylim(0, 1), top.set_yticks([])
    top.set_xticks([i + 0.5 for i in range(len(example["table"]))], [str(i) for i in range(len(example["table"]))])
    top.set_xlabel(f"logical block (white: the physical block in the pool); {length} tokens, blocks of {bs}, hatched: past the length")
    n = len(example["weights"])
    x = range(n)
    bottom.bar([i - 0.2 for i in x], example["weights"], width=0.4, color=[CHUNK_COLOURS[i % len(CHUNK_COLOURS)] for i in x],
               label="exp(lse_c - lse): its weight")
    bottom.bar([i + 0.2 for i in x], [s / length for s in example["sizes"]], width=0.4, color="#c7c7c7", label="its share of the keys")
    bottom.set_xticks(list(x), [f"chunk {i}\n{s} keys, lse {l:.2f}" for i, (s, l) in enumerate(zip(example["sizes"], example["lses"]))])
    bottom.set_ylabel("weight in the merge")
    bottom.legend(fontsize=FONT, frameon=False)
    readable(fig)
    fig.tight_layout()
    return fig
