"""Plots of serving (modules 3 and 4), shared by notebooks 03-04 and the slides' figures
(scripts/make_figures.py draws slides/figures/03_*.png and 04_*.png with these same functions).
The runs they draw come from workshop.serving.runs.
"""

import statistics

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from workshop.figures.generation import (
    FONT,
    MIN_PT,
    TITLE_PT,
    _shown,
    _three_colors,
    readable,
)

IDLE_COLOR, STATIC_COLOR, CONTINUOUS_COLOR, ALONE_COLOR = "0.85", "tab:orange", "tab:blue", "tab:gray"


def plot_timelines(timelines, titles, tokens=None, max_label_steps=40, figsize=None):
    """Draw timelines one above the other on a common step axis, as in the course: rows S1..Sn are
    the batch slots, columns T1..Tm the steps; each request has a colour, its id R<i> at its prefill
    and END at its last token; hatched grey cells are slots held by requests that already finished.
    tokens: optional {request_id: [text of each new token]} to print in the cells (small runs)."""
    width = max(t.n_steps for t in timelines)
    labels = width <= max_label_steps
    # a cell is as wide as its longest token at MIN_PT (about 0.1 in per character): no label is cut
    longest = max([3] + [len(_shown(t).strip()) for out in (tokens or {}).values() for t in out]) if labels else 0
    cell = max(0.5, 0.1 * longest + 0.15)
    figsize = figsize or (1.0 + cell * width, 0.3 + sum(0.42 * t.n_slots + 0.75 for t in timelines))  # 0.42 in: two lines of 12 pt per cell
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
                text = _shown(tokens[rid][step - first]).strip("␣") if tokens and rid in tokens else ""
                if tag:
                    tag = tag.replace("\n", " ")  # one line: R<i> END when a request lasts one step
                    ax.text(step + 0.5, slot + (0.3 if text else 0.5), tag, ha="center", va="center", fontsize=MIN_PT, weight="bold")
                if text:
                    ax.text(step + 0.5, slot + (0.75 if tag else 0.5), text, ha="center", va="center", fontsize=MIN_PT)
        for slot, first, last in timeline.idle:
            for step in range(first, last + 1):
                ax.add_patch(Rectangle((step, slot), 1, 1, facecolor=IDLE_COLOR, edgecolor="white", lw=1.5, hatch="//"))
            if labels:
                ax.text((first + last + 1) / 2, slot + 0.5, "idle", ha="center", va="center", fontsize=MIN_PT, color="0.35")
        ax.set_xlim(0, width)
        ax.set_ylim(timeline.n_slots, 0)
        ax.set_yticks([s + 0.5 for s in range(timeline.n_slots)], [f"S{s + 1}" for s in range(timeline.n_slots)])
        every = max(1, width // 24)
        ax.set_xticks([s + 0.5 for s in range(0, width, every)], [f"T{s + 1}" for s in range(0, width, every)])
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"{title}: {timeline.n_steps} steps, {timeline.occupancy:.0%} of the slots busy", fontsize=FONT, loc="left")
    readable(fig)
    fig.tight_layout()
    return fig


def plot_batch_size_sweep(runs, title=None, figsize=(11.5, 4.2)):
    """Throughput (tokens/s) and median latency against the batch size, one line per engine."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
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
        ax.legend(fontsize=MIN_PT)
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    if title:
        fig.suptitle(title, fontsize=TITLE_PT)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_latency_distributions(runs_by_label, figsize=(11.5, 4.2)):
    """The distributions of time to first token and time per output token, one curve per run
    (e.g. one per arrival rate), as cumulative fractions of the requests: read the median at 0.5,
    the tail at the top."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
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
        ax.legend(fontsize=MIN_PT, loc="lower right")
        ax.grid(alpha=0.3)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_left_padding(input_ids, attention_mask, position_ids, tokenizer, max_cols=14, figsize=None):
    """A left-padded batch (exercise 3's left_pad) as a grid: one row per request, pads grey, each
    real token with its text and its position id."""
    ids, mask, pos = input_ids.cpu()[:, -max_cols:], attention_mask.cpu()[:, -max_cols:], position_ids.cpu()[:, -max_cols:]
    rows, cols = ids.shape
    texts = [[_shown(tokenizer.decode([int(ids[r, c])])) if mask[r, c] else "pad" for c in range(cols)] for r in range(rows)]
    cell = max(0.8, 0.1 * max(len(t) for row in texts for t in row) + 0.2)  # the longest token fits at MIN_PT
    fig, ax = plt.subplots(figsize=figsize or (1.4 + cell * cols, 0.8 + 0.7 * rows))
    for r in range(rows):
        for c in range(cols):
            real = bool(mask[r, c])
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor="tab:blue" if real else IDLE_COLOR, alpha=0.35 if real else 1,
                                   edgecolor="white", lw=2))
            ax.text(c + 0.5, r + 0.32, texts[r][c], ha="center", va="center", fontsize=MIN_PT, color="black" if real else "0.45")
            ax.text(c + 0.5, r + 0.74, f"pos {int(pos[r, c])}" if real else "masked", ha="center", va="center", fontsize=MIN_PT, color="0.3")
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"request {r}" for r in range(rows)])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title("every row's newest token in the last column; positions start at 0 after the pads (␣ = a space)",
                 fontsize=FONT, loc="left")
    readable(fig)
    fig.tight_layout()
    return fig


def attention_masks(kv_module, model, input_ids, attention_mask, position_ids):
    """The boolean mask that exercise 2's forward hands to scaled_dot_product_attention for a padded
    prefill (causal AND not a pad, as module 3 combines them), captured from the call itself:
    [B, T, T], True where query i may attend to key j."""
    from unittest import mock

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    with torch.no_grad(), mock.patch("torch.nn.functional.scaled_dot_product_attention", spy):
        kv_module.forward(model, input_ids, position_ids, kv_module.KVCache(model.config.n_layer), attention_mask)
    B, T = input_ids.shape
    return seen[0].expand(B, 1, T, T)[:, 0].cpu()


def plot_batch_masks(masks, attention_mask, figsize=(11.5, 4.0)):
    """One grid per row of a left-padded batch: the [T, T] mask its queries use in the prefill.
    Dark: a key the query attends to; grey columns: pads, hidden from every query."""
    B, T, _ = masks.shape
    fig, axes = plt.subplots(1, B, figsize=figsize, squeeze=False)
    for b, ax in enumerate(axes[0]):
        grid = masks[b].float()
        ax.imshow(grid, cmap=_three_colors(), vmin=0, vmax=2, interpolation="nearest")
        pads = int((~attention_mask[b].cpu()).sum())
        for j in range(pads):
            ax.axvspan(j - 0.5, j + 0.5, color="0.75", alpha=0.5, lw=0)
        ax.set_title(f"row {b}: {pads} pad{'s' if pads != 1 else ''}", fontsize=FONT)
        ax.set_xticks(range(0, T, 2))
        ax.set_yticks(range(0, T, 2))
        ax.set_xlabel("key column")
        if b == 0:
            ax.set_ylabel("query column")
    readable(fig)
    fig.tight_layout()
    return fig


def record_running_batch(continuous, model, requests, max_batch_size, eos_token_id=-1):
    """Serve `requests` with exercise 4's Engine and record its running batch after every step:
    [(step, [request id per row], mask [rows, width] as lists of bools)]."""
    engine = continuous.Engine(model, max_batch_size, eos_token_id)
    step, snapshots = engine.step, []

    def recorded():
        step()
        batch = engine.running
        snapshots.append((engine.step_index, [seq.id for seq in batch.seqs], batch.mask.cpu().tolist()))

    engine.step = recorded
    engine.run(requests)
    return snapshots


def plot_running_batch(snapshots, steps=None, figsize=(11.5, 4.2)):
    """The running batch's rows (one per running request) and columns (its KV cache positions) after
    some steps: who joined (left-padded to the common width), who left, and columns trimmed when
    a long row leaves. Coloured cells are cached keys; grey, padding."""
    steps = steps or [s for s, _, _ in snapshots][:6]
    chosen = [snap for snap in snapshots if snap[0] in steps]
    width = max(len(m[0]) for _, _, m in chosen if m)
    rows = max(len(ids) for _, ids, _ in chosen)
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, len(chosen), figsize=figsize, squeeze=False, sharey=True)
    previous = {}
    for ax, (step, ids, mask) in zip(axes[0], chosen):
        before = previous
        for r, (rid, row) in enumerate(zip(ids, mask)):
            color = colors[(2 * rid) % 20 if rid % 20 < 10 else (2 * rid + 1) % 20]
            for c, real in enumerate(row):
                ax.add_patch(Rectangle((c, r), 1, 1, facecolor=color if real else "0.88", edgecolor="white", lw=0.5))
            ax.text(-0.5, r + 0.5, f"R{rid}" + (" new" if rid not in before else ""), ha="right", va="center", fontsize=MIN_PT,
                    weight="bold" if rid not in before else "normal")
        left = sorted(set(before) - set(ids))
        ax.set_title(f"after T{step + 1}" + (f"\n{', '.join(f'R{i}' for i in left)} left" if left else "\n "), fontsize=FONT)
        ax.set_xlim(-4.5, width)
        ax.set_ylim(rows, 0)
        ax.set_xlabel(f"{len(mask[0]) if mask else 0} columns")
        ax.axis("off") if not ids else None
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        previous = {rid: True for rid in ids}
    readable(fig)
    fig.tight_layout()
    return fig


def plot_latency_vs_load(load, figsize=(11.5, 4.2)):
    """Median time to first token and time per output token against the arrival rate.
    load: {"rates": [requests/s, None = all at once], "ttft_s": [...], "tpot_s": [...]} (medians)."""
    rates = [r for r in load["rates"] if r is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
    for ax, key, name in ((ax1, "ttft_s", "median time to first token (ms)"), (ax2, "tpot_s", "median time per output token (ms)")):
        values = dict(zip(load["rates"], load[key]))
        ax.plot(rates, [values[r] * 1e3 for r in rates], "o-", color=CONTINUOUS_COLOR, label="Poisson arrivals")
        if None in values:
            ax.axhline(values[None] * 1e3, color=STATIC_COLOR, ls="--", label="all at t = 0")
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        top = max(v for v in values.values()) * 1e3
        ax.set(xlabel="arrival rate (requests/s)", ylabel=name, ylim=(0, 1.45 * top))  # headroom: the legend hides no point
        ax.grid(alpha=0.3)
        ax.legend(fontsize=MIN_PT, loc="upper left")
    readable(fig)
    fig.tight_layout()
    return fig


def _color(label):
    return {"static": STATIC_COLOR, "continuous": CONTINUOUS_COLOR, "one by one": ALONE_COLOR}.get(label, "tab:green")


# ----------------------------------------------------------------------------------------------
# The serving benchmark (bench/serving.py): drawn from its record alone (results/serving.json)

ENGINE_COLORS = {"one-by-one": ALONE_COLOR, "static": STATIC_COLOR, "dynamic": "tab:brown", "continuous": CONTINUOUS_COLOR,
                 "paged": "tab:green"}


def _rate_label(entry):
    if entry["request_rate"] == "inf":
        return "inf\n(all at once)"
    return f"{entry['request_rate']:.3g} req/s\n({entry['load_factor']:.2g}x capacity)"


def plot_throughput_vs_rate(evaluation, figsize=(13, 4.8)):
    """The course's evaluation: output throughput, median time to first token and median time per
    output token of each engine at each arrival rate (finite rates rising, then all at once)."""
    entries = sorted(evaluation["rates"], key=lambda e: float("inf") if e["request_rate"] == "inf" else e["request_rate"])
    x = range(len(entries))
    fig, axes = plt.subplots(1, 3, figsize=figsize)
    panels = (("output_throughput", "output tokens/s", False), ("median_ttft_ms", "median TTFT (ms)", True),
              ("median_tpot_ms", "median TPOT (ms)", False))
    for ax, (key, name, log) in zip(axes, panels):
        for engine in entries[0]["engines"]:
            values = [e["engines"][engine]["metrics"][key] for e in entries]
            ax.plot(x, [float("nan") if v is None else v for v in values], "o-", lw=2, color=ENGINE_COLORS.get(engine, "tab:red"),
                    label=engine)
        ax.set_xticks(list(x), [_rate_label(e) for e in entries])
        ax.set(xlabel="arrival rate", ylabel=name)
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=MIN_PT, frameon=False)
    readable(fig)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def plot_latency_cdfs(evaluation, figsize=(13, 8.4)):
    """Cumulative distributions of time to first token and end-to-end latency per engine, one row
    per finite arrival rate (log time axis): read the median at 0.5, the tail at the top."""
    entries = sorted((e for e in evaluation["rates"] if e["request_rate"] != "inf"), key=lambda e: e["request_rate"])
    fig, axes = plt.subplots(len(entries), 2, figsize=figsize, squeeze=False)
    for row, entry in zip(axes, entries):
        for ax, key, name in ((row[0], "ttft_ms", "time to first token (ms)"), (row[1], "e2el_ms", "end-to-end latency (ms)")):
            for engine, e in entry["engines"].items():
                ms = sorted(e["requests"][key])
                ax.step(ms, [(k + 1) / len(ms) for k in range(len(ms))], where="post", lw=2,
                        color=ENGINE_COLORS.get(engine, "tab:red"), label=engine)
            ax.set_xscale("log")
            ax.set(xlabel=name, ylabel="fraction of requests", ylim=(0, 1.02))
            ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
            ax.set_title(_rate_label(entry).replace("\n", " "), fontsize=FONT, loc="left")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=MIN_PT, frameon=False)
    readable(fig)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig
