"""Static shapes and CUDA graphs (module 11), drawn: shared by notebooks/11_cuda_graphs.ipynb and the slides'
figures (scripts/make_figures.py, slides/figures/11_*.png). Every figure is drawn from a record of
bench/cuda_graphs.py (results/cuda_graphs.json, workshop/replay.py measures) or from what the code under
test computes, never typed in.
"""

import matplotlib.pyplot as plt

from workshop import replay
from workshop.figures.generation import FONT, readable

EX5, STEP = "#d62728", "#1f77b4"
PATH_COLOURS = {"ex5": EX5, "eager": "#ff7f0e", "static": "#9467bd", "replayed": STEP}
LIST_STYLE = {"powers_of_two": ("#1f77b4", "o"), "vllm": ("#2ca02c", "s"), "every_size": ("#7f7f7f", "D"),
              "largest_only": ("#d62728", "^")}


def plot_kernels(kernels, model_name=None, figsize=(11.5, 4.0)):
    """One decode step at batch 1, its ATen ops by kind: exercise 5's forward against exercise 11's decode_step
    (what a graph holds). kernels: bench/cuda_graphs.py's data.kernels (replay.kernels_per_step)."""
    ex5, step = kernels["ex5_forward"], kernels["decode_step"]
    kinds = [k for k, _ in replay.KINDS] + ["other", replay.VIEW]
    kinds = [k for k in kinds if ex5["by_kind"].get(k) or step["by_kind"].get(k)]
    fig, ax = plt.subplots(figsize=figsize)
    y = range(len(kinds))
    height = 0.38
    for offset, counts, label, colour in ((-height / 2, ex5, "exercise 5's forward", EX5), (height / 2, step, "exercise 11's decode_step", STEP)):
        values = [counts["by_kind"].get(k, 0) for k in kinds]
        bars = ax.barh([i + offset for i in y], values, height=height, color=colour,
                       label=f"{label}: {counts['aten_ops']} ops, {counts['kernels']} not views")
        for bar, value in zip(bars, values):
            if value:
                ax.text(bar.get_width() + 0.5, bar.get_y() + bar.get_height() / 2, str(value), va="center", fontsize=FONT - 1)
    ax.set_yticks(list(y), kinds)
    ax.invert_yaxis()
    ax.set_xlabel("ATen operations in one decode step (about one kernel launch each, views none)")
    where = f"{model_name}, " if model_name else ""
    ax.set_title(f"{where}{kernels['layers']} layers, batch {kernels['batch']}", fontsize=FONT)
    ax.legend(fontsize=FONT - 1, frameon=False, loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_step_times(record, figsize=(11.5, 4.3)):
    """Left: one decode step's time per path and batch size. Right: the engine's output tokens/s, exercise 5's
    against exercise 11's with graphs off and on. record: results/cuda_graphs.json (or a GPU's)."""
    data = record["data"]
    engine = data.get("engine")
    fig, axes = plt.subplots(1, 2 if engine else 1, figsize=figsize, gridspec_kw={"width_ratios": [1.6, 1]} if engine else None)
    left = axes[0] if engine else axes
    batches = sorted(data["steps"], key=int)
    paths = [p for p in data["paths"] if all(p in data["steps"][b] for b in batches)]
    width = 0.8 / len(paths)
    for i, path in enumerate(paths):
        xs = [j + (i - (len(paths) - 1) / 2) * width for j in range(len(batches))]
        left.bar(xs, [data["steps"][b][path]["ms"] for b in batches], width=width, color=PATH_COLOURS.get(path),
                 label=data["paths"][path])
    left.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    left.set_ylabel("ms per decode step")
    left.set_title(f"{data['model']}, {record['meta']['machine'] if data['device'] == 'cuda' else 'CPU, one thread'}: "
                   f"sequences of {data['context']} tokens", fontsize=FONT)
    left.legend(fontsize=FONT - 1, frameon=False, loc="upper left")
    left.spines[["top", "right"]].set_visible(False)
    if engine:
        right = axes[1]
        labels = {"ex5": "exercise 5", "graphs_off": "11, graphs off", "graphs_on": "11, graphs on"}
        runs = engine["engines"]
        names = [n for n in labels if n in runs]
        right.bar(range(len(names)), [runs[n]["tokens_per_s"] for n in names],
                  color=[EX5, PATH_COLOURS["eager"], STEP][:len(names)])
        right.set_xticks(range(len(names)), [labels[n] for n in names], rotation=12)
        right.set_ylabel("output tokens/s")
        w = data["workload"]
        right.set_title(f"the engine: {w['requests']} requests, batch {w['batch_size']}", fontsize=FONT)
        right.spines[["top", "right"]].set_visible(False)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_padding(padding, figsize=(11.5, 4.4)):
    """Left: the size a batch of n is padded to, under each list of capture sizes. Right: rows computed per real
    row against the number of graphs captured: the lists, and the best list of each length (batch sizes 1..largest
    equally likely; and the decode steps a real run had, where measured). padding: replay.padding()."""
    largest = padding["largest"]
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize)
    ns = list(range(1, largest + 1))
    left.plot(ns, ns, color="black", linewidth=1, linestyle=":", label="no padding")
    for name, width in (("largest_only", 2.0), ("powers_of_two", 4.5), ("vllm", 1.8)):  # the thick line shows where two coincide
        row = padding["lists"][name]
        colour, _ = LIST_STYLE[name]
        graphs = f"{row['graphs']} graph{'s' if row['graphs'] > 1 else ''}"
        left.step(ns, row["padded"], where="post", color=colour, linewidth=width, label=f"{row['label']} ({graphs})")
    left.set_xlabel("sequences in the decode step")
    left.set_ylabel("rows the graph computes")
    left.set_ylim(0, largest * 1.45)
    left.legend(fontsize=FONT - 1, frameon=False, loc="upper left")
    for mix, style, label in (("uniform", "-", "best k sizes, batches 1..%d alike" % largest),
                              ("measured", "--", "best k sizes, the engine's decode steps")):
        if mix in padding["best"]:
            best = padding["best"][mix]
            right.plot([b["graphs"] for b in best], [b["rows_per_real_row"] for b in best], color="black", linestyle=style,
                       linewidth=1.2, label=label)
    for name, row in padding["lists"].items():
        colour, marker = LIST_STYLE[name]
        right.plot([row["graphs"]], [row["uniform"]], marker=marker, color=colour, markersize=9, linestyle="none",
                   label=row["label"])
    right.set_xscale("log", base=2)
    right.set_xlabel("graphs captured (capture sizes)")
    right.set_ylabel("rows computed per real row")
    right.legend(fontsize=FONT - 1, frameon=False, loc="upper right")
    for ax in (left, right):
        ax.spines[["top", "right"]].set_visible(False)
    readable(fig)
    fig.tight_layout()
    return fig
