"""Serving runs and their metrics (modules 3 and 4: static and continuous batching), shared by the
notebooks, the slides' figures (scripts/make_figures.py) and the benchmark (bench/serving.py).

Every number comes from a real run of the workshop's engines (whichever implementation the caller
passes in): who sat in which batch slot at which step, throughput, occupancy, and per-request
latencies (time to first token, time per output token, end to end).
"""

import statistics
import time
from dataclasses import dataclass, field

from workshop.harness import synchronize

NO_EOS = -1  # a token id that never comes: every request runs to its max_new_tokens


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
