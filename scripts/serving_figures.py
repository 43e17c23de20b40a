"""Measurements and plots of serving (modules 3 and 4: static and continuous batching), shared by
notebooks/03_static_batching.ipynb, notebooks/04_continuous_batching.ipynb and the slides
(scripts/make_figures.py draws slides/figures/03_*.png and 04_*.png with these same functions).

Every picture comes from a real run of the workshop's engines (whichever implementation the caller
passes in): the timeline of who sat in which batch slot at which step, throughput and latency
against the batch size, and the distributions of time to first token and time per output token.

    from scripts.serving_figures import static_timeline, continuous_timeline, plot_timelines
"""

import statistics
import time
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from exercises.harness import synchronize

NO_EOS = -1  # a token id that never comes: every request runs to its max_new_tokens
IDLE_COLOR, STATIC_COLOR, CONTINUOUS_COLOR, ALONE_COLOR = "0.85", "tab:orange", "tab:blue", "tab:gray"


# ----------------------------------------------------------------------------------------------
# Timelines: which request held which slot of the batch at which step

@dataclass
class Timeline:
    n_slots: int
    n_steps: int
    spans: list  # (slot, request_id, first_step, last_step): the request runs there; its prefill at first_step, END at last_step
    idle: list = field(default_factory=list)  # (slot, first_step, last_step): a finished row still holding its slot

    @property
    def occupancy(self):
        busy = sum(last - first + 1 for _, _, first, last in self.spans)
        return busy / (self.n_slots * self.n_steps)


def static_timeline(lengths, batch_size):
    """The timeline of static batching (exercise 3) from each request's number of new tokens: batch
    after batch of batch_size rows, each batch running until its longest request is done."""
    spans, idle, start = [], [], 0
    for first in range(0, len(lengths), batch_size):
        batch = lengths[first:first + batch_size]
        steps = max(batch)
        for slot, n in enumerate(batch):
            spans.append((slot, first + slot, start, start + n - 1))
            if n < steps:
                idle.append((slot, start + n, start + steps - 1))
        start += steps
    return Timeline(min(batch_size, len(lengths)), start, spans, idle)


def continuous_timeline(result):
    """The timeline of a continuous-batching run (exercise 4's EngineResult): each sequence's slot,
    from the step of its prefill to the step of its last token. Steps an idle engine skipped (nothing
    had arrived) stay as empty columns."""
    spans = [(seq.slot, seq.id, seq.admitted_step, seq.finished_step) for seq in result.sequences]
    return Timeline(result.stats.max_batch_size, max((seq.finished_step for seq in result.sequences), default=-1) + 1, spans)


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


# ----------------------------------------------------------------------------------------------
# Throughput and latency

@dataclass
class ServingRun:
    """One engine serving one workload: totals and per-request latencies (seconds)."""
    label: str
    batch_size: int
    tokens: int
    seconds: float
    occupancy: float
    steps: int
    latency: list  # per request: arrival (t=0 for static batching) to its last token
    ttft: list = field(default_factory=list)  # per request, continuous batching only
    tpot: list = field(default_factory=list)
    result: object = None  # continuous batching: the engine's EngineResult, for its timeline

    @property
    def throughput(self):
        return self.tokens / self.seconds


def run_static(static, model, workload, batch_size, eos_token_id=NO_EOS):
    """Serve `workload` (every request there at t=0) with exercise 3's static batching, batch by
    batch, timing each batch: a request's latency is the end of its batch, when its answer comes back."""
    synchronize(model.device)
    start, latency, stats = time.perf_counter(), [], None
    for first in range(0, len(workload), batch_size):
        part = static.generate_batch(model, workload.prompts[first:first + batch_size],
                                     workload.max_new_tokens[first:first + batch_size], eos_token_id)
        synchronize(model.device)
        latency += [time.perf_counter() - start] * len(part.outputs)
        stats = part.stats if stats is None else stats + part.stats
    return ServingRun("static", batch_size, stats.generated_tokens, time.perf_counter() - start, stats.occupancy,
                      stats.forward_passes, latency)


def run_continuous(continuous, model, workload, max_batch_size, eos_token_id=NO_EOS):
    """Serve `workload` with exercise 4's engine, the requests arriving at workload.arrival_times."""
    requests = [continuous.Request(p, n, arrival_time=t) for p, n, t in
                zip(workload.prompts, workload.max_new_tokens, workload.arrival_times)]
    result = continuous.generate(model, requests, max_batch_size, eos_token_id=eos_token_id)
    s = result.stats
    return ServingRun("continuous", max_batch_size, s.generated_tokens, s.elapsed_s, s.occupancy, s.steps,
                      [q.latency for q in result.sequences], [q.ttft for q in result.sequences],
                      [q.tpot for q in result.sequences if len(q.output_ids) > 1], result)


def sweep_batch_sizes(runners, batch_sizes, repeats=1):
    """runners: {label: fn(batch_size) -> ServingRun}. Runs each at each batch size (the labels taking
    turns), keeping the fastest of `repeats` runs. Returns {label: [ServingRun per batch size]}."""
    runs = {label: [] for label in runners}
    for batch_size in batch_sizes:
        for label, fn in runners.items():
            runs[label].append(min((fn(batch_size) for _ in range(repeats)), key=lambda r: r.seconds))
    return runs


def table(runs):
    """The sweep as text, one row per engine and batch size."""
    width = max([6] + [len(label) for label in runs]) + 2
    rows = [f"{'engine':<{width}}{'batch':>6}{'tokens/s':>10}{'occupancy':>11}{'steps':>7}{'median latency':>16}{'median TTFT':>13}{'median TPOT':>13}"]
    for label, series in runs.items():
        for r in series:
            ttft = f"{statistics.median(r.ttft) * 1e3:10.1f} ms" if r.ttft else f"{'-':>13}"
            tpot = f"{statistics.median(r.tpot) * 1e3:10.1f} ms" if r.tpot else f"{'-':>13}"
            rows.append(f"{label:<{width}}{r.batch_size:>6}{r.throughput:>10.0f}{r.occupancy:>11.0%}{r.steps:>7}"
                        f"{statistics.median(r.latency) * 1e3:>13.0f} ms{ttft}{tpot}")
    return "\n".join(rows)


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
