"""Piecewise graphs and fusion (module 12), drawn: shared by notebooks/12_piecewise_graphs.ipynb and the slides'
figures (scripts/make_figures.py, slides/figures/12_*.png). Every figure is drawn from a record of
bench/piecewise_graphs.py (results/piecewise_graphs.json, workshop/fusion.py measures), never typed in.
"""

import re

import matplotlib.pyplot as plt

from workshop.figures.generation import FONT, readable

EAGER, COMPILED = "#d62728", "#1f77b4"
PARTS = (("lm_head", "the LM head", "#7f7f7f"), ("pieces", "the pieces", "#1f77b4"), ("rest", "attention and the rest", "#ff7f0e"))


def kernel_kind(name):
    """An op's or a fused kernel's name without the graph and the counter Inductor gives it:
    "graph_3_cpp_fused_add_native_layer_norm_0" -> "fused: add, native_layer_norm"; "aten::addmm" -> "addmm"."""
    if "cpp_fused" in name or "triton" in name:
        body = re.sub(r"_\d+$", "", re.sub(r"^.*?(cpp_fused_|triton_\w*?fused_)", "", name))
        body = body.replace("native_layer_norm", "layer-norm").replace("copy_", "copy")
        return "fused: " + ", ".join(w.replace("-", "_") for w in body.split("_") if w)
    return name.removeprefix("aten::")


def plot_kernels(kernels, figsize=(11.5, 4.2)):
    """The kernels one mixed step's pieces run, eager (left) against compiled by Inductor (right), by kind.
    kernels: bench/piecewise_graphs.py's data.kernels (fusion.kernels)."""
    fig, axes = plt.subplots(1, 2, figsize=figsize, sharex=True)
    for ax, key, colour, label in ((axes[0], "eager_ops", EAGER, "eager"), (axes[1], "compiled_ops", COMPILED, "compiled (Inductor)")):
        counts = {}
        for name, n in kernels[key].items():
            kind = kernel_kind(name)
            counts[kind] = counts.get(kind, 0) + n
        kinds = sorted(counts, key=lambda k: -counts[k])
        bars = ax.barh(range(len(kinds)), [counts[k] for k in kinds], color=colour)
        for bar, kind in zip(bars, kinds):
            ax.text(bar.get_width() + 0.3, bar.get_y() + bar.get_height() / 2, str(counts[kind]), va="center", fontsize=FONT - 1)
        ax.set_yticks(range(len(kinds)), kinds)
        ax.invert_yaxis()
        total = kernels["eager" if key == "eager_ops" else "compiled"]
        ax.set_title(f"{label}: {total} kernels", fontsize=FONT)
        ax.set_xlabel("kernels in one step's pieces")
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"a step of {kernels['tokens']} tokens, its {kernels['pieces']} pieces", fontsize=FONT)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_step_costs(record, figsize=(11.5, 4.6)):
    """Left: one decode step split into the LM head, the pieces and the rest (attention, packing), through exercise 5's
    forward and the piecewise forward with eager and compiled pieces. Right: the engine's output tokens/s, exercise 5's
    against exercise 12's compiled and on the stand-in's graphs. record: results/piecewise_graphs.json."""
    data = record["data"]
    costs, runs = data["step_costs"], data["engine"]
    ms = costs["ms"]
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.5, 1]})
    rows = [("exercise 5's forward", ms["ex5_forward"], ms["pieces_eager"]),
            ("12, pieces eager", ms["eager"], ms["pieces_eager"]),
            ("12, pieces compiled", ms["compiled"], ms["pieces_compiled"])]
    for i, (label, total, pieces) in enumerate(rows):
        start = 0.0
        for key, name, colour in PARTS:
            width = {"lm_head": ms["lm_head"], "pieces": pieces, "rest": total - ms["lm_head"] - pieces}[key]
            left.barh(i, width, left=start, color=colour, label=name if i == 0 else None)
            start += width
        left.text(start + 0.3, i, f"{total:.1f} ms", va="center", fontsize=FONT - 1)
    left.set_yticks(range(len(rows)), [r[0] for r in rows])
    left.invert_yaxis()
    left.set_xlim(0, max(r[1] for r in rows) * 1.25)
    left.set_xlabel("ms per decode step")
    left.set_title(f"a decode step of {costs['batch']} sequences, CPU, one thread", fontsize=FONT)
    left.legend(fontsize=FONT - 1, frameon=False, loc="upper center", bbox_to_anchor=(0.45, -0.2), ncol=3)
    labels = {"ex5": "exercise 5", "compiled": "12,\ncompiled", "stand_in_graphs": "12, stand-in\ngraphs"}
    names = [n for n in labels if n in runs]
    bars = right.bar(range(len(names)), [runs[n]["tokens_per_s"] for n in names], color=[EAGER, COMPILED, "#9467bd"][:len(names)])
    for bar, n in zip(bars, names):
        right.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{runs[n]['over_ex5']:.2f}x", ha="center",
                   va="bottom", fontsize=FONT - 1)
    right.set_xticks(range(len(names)), [labels[n] for n in names])
    right.set_ylabel("output tokens/s")
    right.set_ylim(0, max(runs[n]["tokens_per_s"] for n in names) * 1.2)
    w = data["workload"]
    right.set_title(f"the engine: {w['requests']} requests, batch {w['batch_size']}", fontsize=FONT)
    for ax in (left, right):
        ax.spines[["top", "right"]].set_visible(False)
    readable(fig)
    fig.tight_layout()
    return fig
