"""Serving runs and their metrics (modules 3 to 5: static and continuous batching, the paged KV
cache; exercise 11's engine on graphs), shared by the notebooks, the slides' figures (scripts/make_figures.py) and the benchmark
(bench/serving.py).

Every number comes from a real run of the workshop's engines (whichever implementation the caller
passes in): who sat in which batch slot at which step, throughput, occupancy, per-request latencies
(time to first token, time per output token, end to end), the KV memory each cache holds, and the
ceiling a decode step sets. The benchmark's baselines, transformers' own engines on the same
weights, are here too.

Each run also keeps one RequestRecord per request (its prompt and output lengths, when it arrived and
when each of its tokens came), and serving_metrics() turns a run's records into the numbers of vLLM's
`bench serve` (throughputs, mean / median / p99 of TTFT, TPOT, ITL and end-to-end latency, goodput):
the same function for the engines in this process and for a server driven over HTTP
(workshop/serving/client.py). In this process a token's time is when the engine produced it, the
moment a streaming server would send it: watched at the model's output layer for exercises 2 and 3
and transformers' generate (one forward = one new token per running row), after each engine step for
exercises 4 and 5, and from transformers' own per-token timestamps for its continuous batching.
"""

import inspect
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from gpt import EOS_TOKEN_ID, hf_config, hf_state_dict
from workshop.grading.harness import synchronize
from workshop.serving.overlap import overlapped

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
    outputs: list = field(default_factory=list)  # per request: its new token ids
    result: object = None  # continuous batching: the engine's EngineResult, for its timeline
    records: list = field(default_factory=list)  # per request: a RequestRecord (when each token came)

    @property
    def throughput(self):
        return self.tokens / self.seconds

    def metrics(self, goodput=None):
        """vLLM's `bench serve` numbers of this run (see serving_metrics)."""
        return serving_metrics(self.records, self.seconds, goodput)


# ----------------------------------------------------------------------------------------------
# Per-request records and the metrics of vLLM's `bench serve`

@dataclass
class RequestRecord:
    """One request as its client saw it. Times in seconds on the run's clock (0 = the run's start).
    token_times: when each token came, in order; a streamed chunk carrying several tokens counts once,
    so a server's chunks or a response that came back whole ([its end]) are records too."""
    prompt_len: int
    output_len: int  # tokens received
    arrival_s: float  # when the request was sent (arrived)
    token_times: list
    success: bool = True
    error: str = ""

    @property
    def ttft(self):
        return self.token_times[0] - self.arrival_s

    @property
    def e2el(self):
        return self.token_times[-1] - self.arrival_s

    @property
    def tpot(self):
        """Time per output token after the first (vLLM's definition: None for a one-token answer)."""
        return (self.e2el - self.ttft) / (self.output_len - 1) if self.output_len > 1 else None

    @property
    def itl(self):
        """The gaps between consecutive tokens (chunks)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (99,)


def parse_goodput(items):
    """SLOs for goodput, as vLLM's --goodput takes them: ["ttft:500", "tpot:50", "e2el:8000"] (ms) ->
    {"ttft": 500.0, ...}. None or [] -> None."""
    if not items:
        return None
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"goodput SLO {item!r}: the name must be ttft, tpot or e2el, as in ttft:500 (milliseconds).")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: give a number of milliseconds after the colon, as in {name}:500.") from None
        if slos[name] <= 0:
            raise ValueError(f"goodput SLO {item!r}: the limit must be a positive number of milliseconds.")
    return slos


def serving_metrics(records, duration, goodput=None, percentiles=PERCENTILES):
    """The numbers of vLLM's `bench serve`, from one RequestRecord per request sent and the run's
    wall-clock duration (s). Keys (vLLM's names): completed, failed, duration, total_input_tokens,
    total_output_tokens, request_throughput (req/s), output_throughput and total_token_throughput
    (tok/s), and for each of ttft, tpot, itl, e2el: mean_<x>_ms, median_<x>_ms, p99_<x>_ms (None
    when nothing was measured: no TPOT for one-token answers). TPOT per request: (e2el - ttft) /
    (output_len - 1); ITL: every gap between consecutive tokens of every request, pooled. With
    goodput ({"ttft": ms, "tpot": ms, "e2el": ms}, any of them): request_goodput, the completed
    requests per second that met every SLO given. Only completed requests count toward tokens and
    latencies; failed ones only toward `failed`."""
    done = [r for r in records if r.success]
    values = {"ttft": [r.ttft for r in done], "tpot": [r.tpot for r in done if r.tpot is not None],
              "itl": [gap for r in done for gap in r.itl], "e2el": [r.e2el for r in done]}
    inputs, outputs = sum(r.prompt_len for r in done), sum(r.output_len for r in done)
    metrics = {"completed": len(done), "failed": len(records) - len(done), "duration": duration,
               "total_input_tokens": inputs, "total_output_tokens": outputs,
               "request_throughput": len(done) / duration, "output_throughput": outputs / duration,
               "total_token_throughput": (inputs + outputs) / duration}
    if goodput:
        metrics["request_goodput"] = sum(meets(r, goodput) for r in done) / duration
    for name in LATENCIES:
        ms = np.array(values[name]) * 1e3
        metrics[f"mean_{name}_ms"] = float(ms.mean()) if ms.size else None
        metrics[f"median_{name}_ms"] = float(np.median(ms)) if ms.size else None
        for p in percentiles:
            metrics[f"p{p:g}_{name}_ms"] = float(np.percentile(ms, p)) if ms.size else None
    return metrics


def meets(record, slos):
    """Whether a completed request met every SLO ({"ttft": ms, ...}); a one-token answer has no TPOT to miss."""
    measured = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return all(measured[name] * 1e3 <= limit for name, limit in slos.items())


@contextmanager
def token_clock(model):
    """The times (time.perf_counter) of every forward through `model`'s output layer (lm_head) while
    the block runs: for exercises 2 and 3 and transformers' generate, one forward gives every running
    row its next token, so forward i is when token i of each row came."""
    times = []

    def stamp(module, args, output):
        synchronize(model.device)
        times.append(time.perf_counter())

    handle = model.lm_head.register_forward_hook(stamp)
    try:
        yield times
    finally:
        handle.remove()


def _token_times(stamps, n, start, returned):
    """The first n forward times (relative to start) as a request's token times; when the forwards
    were not watched as expected (another design of the engine), the whole answer at `returned`."""
    return [t - start for t in stamps[:n]] if len(stamps) >= n > 0 else [returned]


def run_static(static, model, workload, batch_size, eos_token_id=NO_EOS):
    """Serve `workload` with exercise 3's static batching, batch by batch, timing each batch: a
    request's latency is the end of its batch, when its answer comes back. A batch starts once
    batch_size requests have arrived (or the workload's last one): with every request there at
    t=0, at once."""
    return run_dynamic(static, model, workload, batch_size, window=math.inf, label="static", eos_token_id=eos_token_id)


def run_dynamic(static, model, workload, batch_size, window, label="dynamic", eos_token_id=NO_EOS):
    """Dynamic batching, the course's third kind: the requests arrive at workload.arrival_times and
    queue; a batch of the first batch_size waiting requests starts as soon as it is full, or when the
    oldest of them has waited `window` seconds, whichever comes first (or when the workload's last
    request has arrived), and runs to its end with exercise 3's generate_batch (static: the batch is
    fixed until its longest request is done). window=inf is static batching on arrivals; with every
    request there at t=0 both are static batching. Legacy fields: latency is the end of the request's
    batch (the answer comes back whole); records hold each token's time as it was produced."""
    n, arrivals = len(workload), workload.arrival_times
    order = sorted(range(n), key=lambda i: arrivals[i])
    outputs, latency, records, stats = [None] * n, [None] * n, [None] * n, None
    synchronize(model.device)
    start = time.perf_counter()
    with token_clock(model) as stamps:
        served = 0
        while served < n:
            last = min(served + batch_size, n) - 1  # the batch is full when order[last] has arrived
            go = min(arrivals[order[last]], arrivals[order[served]] + window)
            wait = go - (time.perf_counter() - start)
            if wait > 0:
                time.sleep(wait)
            now = time.perf_counter() - start
            batch = [i for i in order[served:last + 1] if arrivals[i] <= now]
            first_stamp = len(stamps)
            part = static.generate_batch(model, [workload.prompts[i] for i in batch],
                                         [workload.max_new_tokens[i] for i in batch], eos_token_id)
            synchronize(model.device)
            end = time.perf_counter() - start
            for i, out in zip(batch, part.outputs):
                outputs[i], latency[i] = out, end - arrivals[i]
                records[i] = RequestRecord(len(workload.prompts[i]), len(out), arrivals[i],
                                           _token_times(stamps[first_stamp:], len(out), start, end))
            stats = part.stats if stats is None else stats + part.stats
            served += len(batch)
    return ServingRun(label, batch_size, stats.generated_tokens, time.perf_counter() - start, stats.occupancy,
                      stats.forward_passes, latency, outputs=outputs, records=records)


def run_continuous(continuous, model, workload, max_batch_size, eos_token_id=NO_EOS):
    """Serve `workload` with exercise 4's engine, the requests arriving at workload.arrival_times."""
    return _run_engine("continuous", continuous, model, workload, max_batch_size, eos_token_id)


def run_paged(paged, model, workload, max_batch_size, eos_token_id=NO_EOS, sampling=None, overlap=False, label="paged",
              **engine_options):
    """Serve `workload` with exercise 5's engine (continuous batching on a paged KV cache), the requests
    arriving at workload.arrival_times. sampling: None (greedy) or one workshop.serving.sampling.SamplingParams
    per request. overlap: False (exercise 5's step as it is), True (overlap scheduling, workshop/serving/overlap.py,
    anywhere) or None (on CUDA only). engine_options: num_blocks (default: max_batch_size whole contexts, exercise 4's
    worst case), block_size, max_num_batched_tokens, enable_prefix_caching."""
    engine = paged if overlap is False else SimpleNamespace(
        Request=paged.Request, Engine=lambda *args, **kwargs: overlapped(paged.Engine)(*args, overlap=overlap, **kwargs))
    return _run_engine(label, engine, model, workload, max_batch_size, eos_token_id, sampling, **engine_options)


def run_paged_graphs(graphs_module, model, workload, max_batch_size, eos_token_id=NO_EOS, cuda_graphs=None, overlap=None, label=None,
                     **engine_options):
    """Serve `workload` with exercise 11's engine: exercise 5's, its decode-only steps through one graph per
    capture size. cuda_graphs: None (the engine's default: graphs on CUDA only), True (anywhere: on a CPU,
    workshop.graphs' stand-in) or False. overlap: None (overlap scheduling on CUDA only, workshop/serving/overlap.py),
    True (anywhere) or False (never). Its requests are exercise 5's (graphs_module.paged.Request)."""
    engine = SimpleNamespace(Request=graphs_module.paged.Request,
                             Engine=lambda *args, **kwargs: overlapped(graphs_module.Engine)(*args, cuda_graphs=cuda_graphs,
                                                                                             overlap=overlap, **kwargs))
    return _run_engine(label or "paged-graphs", engine, model, workload, max_batch_size, eos_token_id, **engine_options)


def _run_engine(label, engine, model, workload, max_batch_size, eos_token_id, sampling=None, **engine_options):
    """An engine of exercise 4 or 5 over `workload`; occupancy is tokens generated / (steps x max_batch_size).
    Each token's time is watched after every engine step (the engine's own stamps for the first and last).
    sampling: None (the engine's default, greedy) or one SamplingParams per request."""
    requests = [engine.Request(p, n, arrival_time=t) if sampling is None else engine.Request(p, n, arrival_time=t, sampling=s)
                for p, n, t, s in zip(workload.prompts, workload.max_new_tokens, workload.arrival_times, sampling or [None] * len(workload))]
    runner = engine.Engine(model, max_batch_size, eos_token_id=eos_token_id, **engine_options)
    watched = watch_tokens(runner)
    result = runner.run(requests)
    s = result.stats
    occupancy = s.generated_tokens / (s.steps * max_batch_size) if s.steps else 0.0
    records = []
    for seq in result.sequences:
        times = watched.get(id(seq), [])
        times = ([seq.first_token_s, *times[1:-1], seq.finish_s] if len(times) == len(seq.output_ids) > 1
                 else [seq.first_token_s] + ([seq.finish_s] if len(seq.output_ids) > 1 else []))
        records.append(RequestRecord(len(seq.request.prompt_ids), len(seq.output_ids), seq.arrival_s, times))
    return ServingRun(label, max_batch_size, s.generated_tokens, s.elapsed_s, occupancy, s.steps,
                      [q.latency for q in result.sequences], [q.ttft for q in result.sequences],
                      [q.tpot for q in result.sequences if len(q.output_ids) > 1], result.outputs, result, records)


def watch_tokens(engine):
    """Watch an engine of exercise 4 or 5 (its step() and sequences, nothing else changes): after each
    step, the engine's clock for every token a sequence got in it. Returns {id(sequence): [times]},
    filled as the engine runs."""
    times, live, step = {}, [], engine.step

    def watched_step():
        done = step()
        now = engine.clock()
        new = engine.sequences[len(times):]  # submitted since the last step (all of them, before the first)
        times.update((id(seq), []) for seq in new)
        live.extend(new)
        for seq in live:
            got = times[id(seq)]
            got.extend([now] * (len(seq.output_ids) - len(got)))
        live[:] = [seq for seq in live if seq.finished_step < 0]
        return done

    engine.step = watched_step
    return times


def run_one_by_one(generate, model, workload, eos_token_id=NO_EOS):
    """Serve `workload` one request after the other with a single-request `generate` (exercise 2's KV
    cache): the baseline that batching must beat. A request starts once it has arrived and the one
    before it is done."""
    synchronize(model.device)
    start, outputs, latency, records = time.perf_counter(), [], [], []
    with token_clock(model) as stamps:
        for prompt, n, arrival in zip(workload.prompts, workload.max_new_tokens, workload.arrival_times):
            wait = arrival - (time.perf_counter() - start)
            if wait > 0:
                time.sleep(wait)
            first_stamp = len(stamps)
            outputs.append(generate(model, prompt, n, eos_token_id))
            synchronize(model.device)
            end = time.perf_counter() - start
            latency.append(end - arrival)
            records.append(RequestRecord(len(prompt), len(outputs[-1]), arrival,
                                         _token_times(stamps[first_stamp:], len(outputs[-1]), start, end)))
    tokens = sum(map(len, outputs))
    return ServingRun("one-by-one", 1, tokens, time.perf_counter() - start, 1.0, tokens, latency, outputs=outputs,
                      records=records)


@torch.no_grad()
def run_speculative(speculative, target, draft, workload, k, eos_token_id=NO_EOS):
    """Batch 1, one request after the other (as run_one_by_one), with exercise 7's speculative
    decoding: `draft` proposes k tokens a round, `target` verifies them in one forward, greedy. The
    tokens of a round come together (one chunk). result: the summed SpeculativeStats counts."""
    start, outputs, latency, records = time.perf_counter(), [], [], []
    counts = {"target_forwards": 0, "draft_forwards": 0, "drafted": 0, "accepted": 0, "generated": 0}
    for prompt, n, arrival in zip(workload.prompts, workload.max_new_tokens, workload.arrival_times):
        wait = arrival - (time.perf_counter() - start)
        if wait > 0:
            time.sleep(wait)
        decoder = speculative.SpeculativeDecoder(target, draft, prompt, k=k, eos_token_id=eos_token_id)
        out, times = [], []
        while len(out) < n and not decoder.finished:
            out += decoder.step(n - len(out))
            synchronize(target.device)
            times.append(time.perf_counter() - start)
        outputs.append(out)
        latency.append(times[-1] - arrival)
        records.append(RequestRecord(len(prompt), len(out), arrival, times))
        for key in counts:
            counts[key] += getattr(decoder.stats, key)
    tokens = sum(map(len, outputs))
    return ServingRun("speculative", 1, tokens, time.perf_counter() - start, 1.0, counts["target_forwards"], latency,
                      outputs=outputs, result=counts, records=records)


def median_run(runs):
    """The run whose wall-clock time is the median of `runs` (the lower middle for an even count): one
    real run, so its latencies and counters belong together, and one slow outlier cannot move it."""
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def sweep_batch_sizes(runners, batch_sizes, repeats=3):
    """runners: {label: fn(batch_size) -> ServingRun}. Runs each at each batch size `repeats` times,
    the labels taking turns (so a burst of load hits them alike), and keeps the median run.
    Returns {label: [ServingRun per batch size]}."""
    runs = {label: [] for label in runners}
    for batch_size in batch_sizes:
        samples = {label: [] for label in runners}
        for _ in range(repeats):
            for label, fn in runners.items():
                samples[label].append(fn(batch_size))
        for label in runners:
            runs[label].append(median_run(samples[label]))
    return runs


def largest_batch(fits, known_good, most):
    """The largest batch size b in known_good..most for which fits(b), by bisection (about log2(most)
    calls of fits). Assumes what holds for KV memory: once a batch does not fit, no larger one does."""
    good, bad = known_good, most + 1
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good


def table(runs):
    """The sweep as text, one row per engine and batch size."""
    width = max([6] + [len(label) for label in runs]) + 2
    rows = [f"{'engine':<{width}}{'batch':>6}{'tokens/s':>10}{'occupancy':>11}{'steps':>7}{'median latency':>16}{'median TTFT':>13}{'median TPOT':>13}"]
    for label, series in runs.items():
        for r in series:
            ttft = f"{statistics.median(r.ttft) * 1e3:10.1f} ms" if r.ttft else f"{'-':>13}"
            tpot = f"{statistics.median(r.tpot) * 1e3:10.1f} ms" if r.tpot else f"{'-':>13}"
            occupancy = f"{r.occupancy:>11.0%}" if r.occupancy is not None else f"{'-':>11}"
            steps = f"{r.steps:>7}" if r.steps is not None else f"{'-':>7}"
            latency = f"{statistics.median(r.latency) * 1e3:>13.0f} ms" if r.latency else f"{'-':>16}"
            rows.append(f"{label:<{width}}{r.batch_size:>6}{r.throughput:>10.0f}{occupancy}{steps}{latency}{ttft}{tpot}")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# KV memory: the token slots a cache holds, and how many of them hold a token

@dataclass
class KVMemory:
    """A KV cache over one run, step by step: the token slots it holds (per layer; every layer holds
    the same) and how many of those hold a cached token."""
    slots: list = field(default_factory=list)
    tokens: list = field(default_factory=list)

    @property
    def peak_slots(self):
        return max(self.slots, default=0)

    @property
    def utilization(self):
        """Tokens held / slots held, summed over the steps (a step holding more memory weighs more)."""
        return sum(self.tokens) / sum(self.slots) if sum(self.slots) else 0.0

    def record(self):
        return {"peak_slots": self.peak_slots, "utilization": self.utilization}


def paged_kv_memory(result):
    """Exercise 5's pool over a run (its EngineResult): the blocks in use at each step, block_size slots each."""
    s = result.stats
    return KVMemory([blocks * s.block_size for blocks in s.blocks_in_use], list(s.tokens_stored))


def continuous_kv_memory(continuous, model, workload, max_batch_size, eos_token_id=NO_EOS):
    """Serve `workload` with exercise 4's engine, watching its running batch at the fullest moment of
    each step: after the decode and the newcomers' prefill, just before the finished rows leave
    (RunningBatch.remove). Nothing in the engine changes. Returns two KVMemory on this schedule:

      batch        exercise 4's one left-padded cache: rows x width slots, mask.sum() of them hold a token
      reservation  contiguous reservation, as serving systems did before paging: each running request
                   holds prompt + max_new_tokens slots, reserved when it is admitted

    Both hold the same tokens. None when the engine has no such running batch to watch (another design)."""
    engine = continuous.Engine(model, max_batch_size, eos_token_id)
    batch, reservation = KVMemory(), KVMemory()
    running = getattr(engine, "running", None)
    if not (hasattr(running, "mask") and hasattr(running, "remove") and hasattr(running, "seqs")):
        return None
    remove = running.remove

    def watched(done):
        held = int(running.mask.sum())
        batch.slots.append(running.mask.numel())
        batch.tokens.append(held)
        reservation.slots.append(sum(len(seq.request.prompt_ids) + seq.request.max_new_tokens for seq in running.seqs))
        reservation.tokens.append(held)
        return remove(done)

    running.remove = watched
    result = engine.run([continuous.Request(p, n, arrival_time=t) for p, n, t in
                         zip(workload.prompts, workload.max_new_tokens, workload.arrival_times)])
    if len(batch.slots) != result.stats.steps or engine.running is not running:
        return None  # it does not remove rows once per step from this batch: what was watched is not its cache
    return batch, reservation


@torch.no_grad()
def decode_ceiling(model, batch_size, repeats=50, warmup=5):
    """Generated tokens per second that the model's decode step allows at this batch size, with nothing
    around it: one forward of batch_size new tokens ([B, 1] ids and positions through gpt.py's model),
    attending to no cache, warmed up, the median of `repeats`. An engine's decode steps cost more (they
    also attend over their caches, and schedule, pad and copy), so its throughput is a fraction of this."""
    ids = torch.zeros(batch_size, 1, dtype=torch.long, device=model.device)
    times = []
    for i in range(warmup + repeats):
        synchronize(model.device)
        start = time.perf_counter()
        model(ids, ids)
        synchronize(model.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return batch_size / statistics.median(times)


@torch.no_grad()
def bare_steps(model, batch_sizes, scheduled_tokens):
    """Seconds that a run's schedule takes as bare forwards, nothing around them: each step's N tokens as
    decode_ceiling's forward does them (each its own sequence of one, attending to no cache), logits for its B rows
    (the sequences in it). An engine with no work but its model would take this long on that schedule, so tokens /
    this is what the schedule allows (its prompts, its part-empty batches at the end): the engine's share of it is
    what everything else in its steps costs (attending over the cache, packing, sampling, scheduling)."""
    transformer = model.transformer
    ids = torch.zeros(max(scheduled_tokens, default=1), 1, dtype=torch.long, device=model.device)
    synchronize(model.device)
    start = time.perf_counter()
    for rows, tokens in zip(batch_sizes, scheduled_tokens):
        x = transformer.wte(ids[:tokens]) + transformer.wpe(ids[:tokens])
        for block in transformer.h:
            x = block(x)
        model.lm_head(transformer.ln_f(x[:rows]))
    synchronize(model.device)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------------------------
# transformers' engines on the workshop's weights: the benchmark's baselines

def transformers_twin(model):
    """transformers' GPT2LMHeadModel with `model`'s weights (the same numbers, same dtype), in eval mode
    on model.device: the outside baseline the benchmark runs beside our engines."""
    from transformers import GPT2LMHeadModel

    twin = GPT2LMHeadModel(hf_config(model.config)).to(device=model.device, dtype=model.transformer.wte.weight.dtype)
    missing, unexpected = twin.load_state_dict(hf_state_dict(model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head is tied to wte
    twin.tie_weights()
    return twin.eval()


@torch.no_grad()
def run_hf_static(hf_model, workload, batch_size):
    """transformers' generate on left-padded batches, in order: each batch runs until its longest
    request is done (static batching). Every request is there at t=0."""
    from solutions.ex3_static_batching import left_pad  # padded by the reference

    synchronize(hf_model.device)
    start, outputs, latency, records, steps, slot_steps = time.perf_counter(), [], [], [], 0, 0
    with token_clock(hf_model) as stamps:
        for first in range(0, len(workload), batch_size):
            prompts = workload.prompts[first:first + batch_size]
            limits = workload.max_new_tokens[first:first + batch_size]
            input_ids, mask, _ = left_pad(prompts, device=hf_model.device)
            first_stamp = len(stamps)
            out = hf_model.generate(input_ids, attention_mask=mask.long(), max_new_tokens=max(limits), min_new_tokens=max(limits),
                                    do_sample=False, pad_token_id=EOS_TOKEN_ID)
            synchronize(hf_model.device)
            end = time.perf_counter() - start
            for row, (prompt, n) in zip(out.tolist(), zip(prompts, limits)):
                outputs.append(row[input_ids.shape[1]:input_ids.shape[1] + n])
                records.append(RequestRecord(len(prompt), len(outputs[-1]), 0.0, _token_times(stamps[first_stamp:], n, start, end)))
            latency += [end] * len(prompts)
            steps += max(limits)
            slot_steps += max(limits) * len(prompts)
    tokens = sum(workload.max_new_tokens)
    return ServingRun("hf-static", batch_size, tokens, time.perf_counter() - start, tokens / slot_steps, steps, latency,
                      outputs=outputs, records=records)


@torch.no_grad()
def run_hf_continuous(hf_model, workload, batch_size):
    """transformers' continuous batching (the engine behind its generate_batch, over a paged KV cache),
    each request added at its arrival time with its own max_new_tokens. Timed from the moment its
    manager runs (its start-up is a server's, once); it reports no per-step schedule, so occupancy and
    steps stay None. Token times: transformers' own (record_timestamps, the same clock)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    # generate_batch gives every request the same max_new_tokens: its manager takes one per request
    config = GenerationConfig(max_new_tokens=max(workload.max_new_tokens), do_sample=False, eos_token_id=NO_EOS,
                              pad_token_id=EOS_TOKEN_ID)
    # Sized for the workload: left to itself it takes 90% of the free memory for its cache, the CPU's RAM included.
    page = 256
    # transformers 5.18 renamed the setting: block_size before it (5.11-5.17), the tokens of a block of a full-attention
    # layer, as all of GPT-2's are; 5.18 and later still take block_size, with a deprecation warning
    renamed = "page_size" in inspect.signature(ContinuousBatchingConfig).parameters
    batching = ContinuousBatchingConfig(**{"page_size" if renamed else "block_size": page}, max_requests_per_batch=batch_size,
                                        max_batch_tokens=batch_size * max(map(len, workload.prompts)),
                                        num_blocks=sum(-(-(len(p) + n) // page) for p, n in zip(workload.prompts, workload.max_new_tokens)))
    hints = WorkloadHints(max_prompt_length=max(map(len, workload.prompts)),
                          max_generated_length=max(workload.max_new_tokens), num_requests=len(workload))
    finished, arrivals = {}, workload.arrival_times
    order = sorted(range(len(workload)), key=lambda i: arrivals[i])
    # no warm-up: it captures CUDA graphs, and on a CPU it only costs tens of seconds
    with hf_model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=batching, block=True,
                                                      timeout=5, warmup=hf_model.device.type == "cuda", workload_hints=hints) as manager:
        # timed from here: the manager's start-up is paid once per server, not per workload
        synchronize(hf_model.device)
        start = time.perf_counter()
        while len(finished) < len(workload):
            now = time.perf_counter() - start
            while order and arrivals[order[0]] <= now:
                i = order.pop(0)
                manager.add_request(workload.prompts[i], request_id=f"req_{i}", max_new_tokens=workload.max_new_tokens[i],
                                    eos_token_id=NO_EOS, record_timestamps=True)
            result = manager.get_result(timeout=min(1.0, max(0.001, arrivals[order[0]] - now)) if order else 1)
            if result is not None and result.is_finished():
                finished[result.request_id] = result
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching manager stopped before every request finished")
        synchronize(hf_model.device)
        seconds = time.perf_counter() - start
    results = [finished[f"req_{i}"] for i in range(len(workload))]
    outputs = [r.generated_tokens for r in results]
    records = [RequestRecord(len(p), len(r.generated_tokens), t, [stamp - start for stamp in r.timestamps or []] or [seconds],
                             success=r.error is None, error=r.error or "")
               for p, r, t in zip(workload.prompts, results, arrivals)]
    latency = [rec.e2el for rec in records]
    return ServingRun("hf-continuous", batch_size, sum(map(len, outputs)), seconds, None, None, latency, outputs=outputs,
                      records=records)
