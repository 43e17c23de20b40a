"""Plots of serving (modules 3 and 4), shared by notebooks 03-04 and the slides' figures
(scripts/make_figures.py draws slides/figures/03_*.png and 04_*.png with these same functions).
The runs they draw come from workshop.serving.
"""

import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

IDLE_COLOR, STATIC_COLOR, CONTINUOUS_COLOR, ALONE_COLOR = "0.85", "tab:orange", "tab:blue", "tab:gray"


def plot_timelines(timelines, titles, tokens=None, max_label_steps=40, figsize=None):
    """Draw timelines one above the other on a common step axis, as in the course: rows S1..Sn are
    the batch slots, columns T1..Tm the steps; each request has a colour, its id R<i> at its prefill
    and END at its last token; hatched grey cells are slots held by requests that already finished.
    tokens: optional {request_id: [text of each new token]} to print in the cells (small runs)."""
    width = max(t.n_steps for t in timelines)
    labels = width <= max_label_steps
    figsize = figsize or (min(16.0, 1.5 + 0.62 * width), 0.5 + sum(0.55 * t.n_slots + 0.75 for t in timelines))
    fig, axes = plt.subplots(len(timelines), 1, figsize=figsize, squeeze=False)
    colors = plt.get_cmap("tab20").colors
    for ax, timeline, title in zip(axes[:, 0], timelines, titles):
        for slot, rid, first, last in timeline.spans:
            color = colors[(2 * rid) % 20 if rid % 20 < 10 else (2 * rid + 1) % 20]
            for step in range(first, last + 1):
                ax.add_patch(Rectangle((step, slot), 1, 1, facecolor=color, alpha=0.8, edgecolor="white", lw=1.5))
                if not labels:
                    continue
                tag = "\n".join(filter(None, [f"R{rid}" if step == first else "", "END" if step == last else ""]))
                text = tokens[rid][step - first].replace("\n", "\\n").strip()[:8] if tokens and rid in tokens else ""
                if tag:
                    ax.text(step + 0.5, slot + (0.3 if text else 0.5), tag, ha="center", va="center", fontsize=7, weight="bold")
                if text:
                    ax.text(step + 0.5, slot + (0.78 if tag else 0.5), text, ha="center", va="center", fontsize=6.5)
        for slot, first, last in timeline.idle:
            for step in range(first, last + 1):
                ax.add_patch(Rectangle((step, slot), 1, 1, facecolor=IDLE_COLOR, edgecolor="white", lw=1.5, hatch="//"))
            if labels:
                ax.text((first + last + 1) / 2, slot + 0.5, "idle", ha="center", va="center", fontsize=7, color="0.35")
        ax.set_xlim(0, width)
        ax.set_ylim(timeline.n_slots, 0)
        ax.set_yticks([s + 0.5 for s in range(timeline.n_slots)], [f"S{s + 1}" for s in range(timeline.n_slots)])
        every = max(1, width // 24)
        ax.set_xticks([s + 0.5 for s in range(0, width, every)], [f"T{s + 1}" for s in range(0, width, every)], fontsize=8)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"{title}: {timeline.n_steps} steps, {timeline.occupancy:.0%} of the slots busy", fontsize=10, loc="left")
    fig.tight_layout()
    return fig


def plot_batch_size_sweep(runs, title=None):
    """Throughput (tokens/s) and median latency against the batch size, one line per engine."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, series in runs.items():
        color = _color(label)
        sizes = [r.batch_size for r in series]
        ax1.plot(sizes, [r.throughput for r in series], "o-", color=color, label=label)
        ax2.plot(sizes, [statistics.median(r.latency) for r in series], "o-", color=color, label=f"{label}: end-to-end")
        if series[0].ttft:
            ax2.plot(sizes, [statistics.median(r.ttft) for r in series], "s--", color=color, alpha=0.7, label=f"{label}: first token")
    for ax, ylabel in ((ax1, "throughput (generated tokens/s)"), (ax2, "median latency (s)")):
        ax.set_xlabel("batch size (max running requests)")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_latency_distributions(runs_by_label):
    """The distributions of time to first token and time per output token, one curve per run
    (e.g. one per arrival rate), as cumulative fractions of the requests: read the median at 0.5,
    the tail at the top."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = plt.get_cmap("viridis")
    for i, (label, run) in enumerate(runs_by_label.items()):
        color = colors(i / max(1, len(runs_by_label) - 1) * 0.85)
        for ax, values in ((ax1, run.ttft), (ax2, run.tpot)):
            ms = sorted(v * 1e3 for v in values)
            fractions = [(k + 1) / len(ms) for k in range(len(ms))]
            ax.step(ms, fractions, where="post", color=color, lw=2, label=f"{label}: median {statistics.median(ms):.0f} ms")
    ax1.set_xlabel("time to first token (ms)")
    ax2.set_xlabel("time per output token (ms)")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of requests")
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_left_padding(input_ids, attention_mask, position_ids, tokenizer, max_cols=14):
    """A left-padded batch (exercise 3's left_pad) as a grid: one row per request, pads grey, each
    real token with its text and its position id."""
    ids, mask, pos = input_ids.cpu()[:, -max_cols:], attention_mask.cpu()[:, -max_cols:], position_ids.cpu()[:, -max_cols:]
    rows, cols = ids.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.78 * cols, 0.6 + 0.62 * rows))
    for r in range(rows):
        for c in range(cols):
            real = bool(mask[r, c])
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor="tab:blue" if real else IDLE_COLOR, alpha=0.35 if real else 1,
                                   edgecolor="white", lw=2))
            text = tokenizer.decode([int(ids[r, c])]).replace("\n", "\\n") if real else "pad"
            ax.text(c + 0.5, r + 0.42, text[:7], ha="center", va="center", fontsize=7.5, color="black" if real else "0.45")
            ax.text(c + 0.5, r + 0.8, f"pos {int(pos[r, c])}" if real else "masked", ha="center", va="center", fontsize=6, color="0.3")
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"request {r}" for r in range(rows)])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("left padding: every row's newest token in the last column; positions start at 0 after the pads",
                 fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def _color(label):
    return {"static": STATIC_COLOR, "continuous": CONTINUOUS_COLOR, "one by one": ALONE_COLOR}.get(label, "tab:green")
