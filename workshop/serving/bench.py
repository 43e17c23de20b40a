"""The serving benchmark, part by part (bench/serving.py and bench/serve_bench.py are its command lines).

Every part runs engines side by side in this process on the same weights, greedy, the end-of-text
token ignored so that every engine does the same work, taking turns over `repeats` rounds (each
round starts with another engine, so a burst of load on the machine hits them alike); a reported run
is the median one by wall-clock time, a ratio the median of the per-round ratios. Metrics are
workshop.serving.runs.serving_metrics(), vLLM's `bench serve` names, from per-request records.

  compare_engines      one mixed workload through our engines and transformers' (the README's numbers)
  measure_kv_memory    the KV slots each cache holds on it; budget_experiment: a fixed KV budget
  course_evaluation    the course's evaluation at CPU scale: no batching, static, dynamic, continuous,
                       paged at arrival rates inf and two finite ones (below and above the capacity)
  speculative_vs_plain batch 1: exercise 7's speculative decoding against exercise 2's generate
  online_vs_offline    serve.py over HTTP against the same engine in this process, same requests
  targets              the issue's targets, read off the record
  rows, write_rows     the record as one row per engine and load (JSON list and CSV)
  write_report         docs/benchmarks.md and its plots, drawn from the record alone
"""

import csv
import json
import statistics
from pathlib import Path

from tqdm.auto import tqdm

import gpt
from workshop.serving import runs as serving
from workshop.grading.harness import implementation
from workshop.serving.workloads import mixed_workload

NO_EOS = serving.NO_EOS
OURS = ("static", "continuous", "paged", "paged-graphs")  # our engines on the mixed workload, all there at once (paged-graphs: CUDA only)
# (slow, fast): how many times faster the second engine's run is than the first's
SPEEDUPS = {"static_vs_one_by_one": ("one-by-one", "static"), "continuous_vs_one_by_one": ("one-by-one", "continuous"),
            "continuous_vs_static": ("static", "continuous"), "static_vs_hf_static": ("hf-static", "static"),
            "continuous_vs_hf_continuous": ("hf-continuous", "continuous"), "paged_graphs_vs_paged": ("paged", "paged-graphs"),
            "paged_graphs_vs_hf_continuous": ("hf-continuous", "paged-graphs")}
EVALUATED = ("one-by-one", "static", "dynamic", "continuous", "paged")  # the course's no batching ... paged
METRICS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
           "request_goodput", "output_throughput", "total_token_throughput",
           *(f"{stat}_{name}_ms" for name in serving.LATENCIES for stat in ("mean", "median", "p99")))


# ----------------------------------------------------------------------------------------------
# Taking turns

def take_turns(engines, repeats, desc="rounds", progress=True, after_round=None):
    """Run each engine (a function returning a ServingRun) `repeats` times, round after round, each
    round starting with the next engine. Returns {label: [ServingRun per round]}."""
    labels, samples = list(engines), {label: [] for label in engines}
    with tqdm(total=repeats * len(labels), desc=desc, unit="run", disable=not progress, leave=False) as bar:
        for r in range(repeats):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                bar.set_postfix_str(label)
                run = engines[label]()
                run.label = label
                samples[label].append(run)
                bar.update()
            if after_round:
                after_round()
    return samples


def identical(runs, expected):
    """The fewest outputs, over the runs, equal to the expected ones."""
    return min(sum(a == b for a, b in zip(run.outputs, expected)) for run in runs)


def median_ratio(slow, fast):
    """Median over rounds of slow's seconds / fast's (round r against round r)."""
    return statistics.median(a.seconds / b.seconds for a, b in zip(slow, fast))


def per_request(run):
    """The per-request latencies of a run (ms, 0.01 ms), for the CDF plots."""
    done = [r for r in run.records if r.success]
    return {"ttft_ms": [round(r.ttft * 1e3, 2) for r in done], "e2el_ms": [round(r.e2el * 1e3, 2) for r in done],
            "tpot_ms": [round(r.tpot * 1e3, 2) for r in done if r.tpot is not None]}


# ----------------------------------------------------------------------------------------------
# The mixed workload through every engine, all there at once

def compare_engines(model, modules, workload, batch_size, repeats, arriving=None, block_size=16, twin=None, goodput=None,
                    progress=True):
    """Our engines and transformers' (when `twin`, a transformers_twin of model) on `workload`, all
    there at once; with `arriving` (the same requests arriving as a Poisson process), exercise 4 on it too.
    modules: {"ex2": ..., "ex3": ..., "ex4": ..., "ex5": ...}, and "ex11": exercise 11's engine joins as paged-graphs
    (its decode steps on CUDA graphs) where the model is on CUDA (on a CPU its default is exercise 5's engine; bench/
    cuda_graphs.py measures it there). Returns (runs, samples, engines record, speedups, Ceilings measured once a round)."""
    ex2, ex3, ex4, ex5 = (modules[k] for k in ("ex2", "ex3", "ex4", "ex5"))
    engines = {
        "one-by-one": lambda w: serving.run_one_by_one(ex2.generate, model, w),
        "static": lambda w: serving.run_static(ex3, model, w, batch_size),
        "continuous": lambda w: serving.run_continuous(ex4, model, w, batch_size),
        "paged": lambda w: serving.run_paged(ex5, model, w, batch_size, block_size=block_size),
    }
    if modules.get("ex11") is not None and model.device.type == "cuda":
        engines["paged-graphs"] = lambda w: serving.run_paged_graphs(modules["ex11"], model, w, batch_size, block_size=block_size)
    if arriving is not None:
        engines["continuous-poisson"] = lambda w: serving.run_continuous(ex4, model, arriving if w is workload else w, batch_size)
    if twin is not None:
        engines["hf-static"] = lambda w: serving.run_hf_static(twin, w, batch_size)
        engines["hf-continuous"] = lambda w: serving.run_hf_continuous(twin, w, batch_size)
    warm_up = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    for run in engines.values():  # first calls pay one-off costs (allocations, transformers' manager)
        run(warm_up)
    expected = [ex2.generate(model, p, n, NO_EOS) for p, n in zip(workload.prompts, workload.max_new_tokens)]
    ceilings = Ceilings(model, batch_size, serving.run_paged(ex5, model, workload, batch_size, block_size=block_size))
    samples = take_turns({label: (lambda run=run: run(workload)) for label, run in engines.items()}, repeats,
                         "mixed workload", progress, after_round=ceilings.measure)
    runs = {label: serving.median_run(samples[label]) for label in engines}
    record = {label: engine_record(run, samples[label], identical(samples[label], expected), goodput) for label, run in runs.items()}
    speedups = {name: median_ratio(samples[slow], samples[fast]) for name, (slow, fast) in SPEEDUPS.items()
                if slow in samples and fast in samples}
    return runs, samples, record, speedups, ceilings


def engine_record(run, samples, identical, goodput=None):
    """One engine's numbers: the legacy ones the README quotes (None where the engine does not report
    one) and vLLM's under "metrics"."""
    def median(values):
        return statistics.median(values) if values else None

    return {"label": run.label, "tokens": run.tokens, "seconds": run.seconds, "tokens_per_s": run.throughput,
            "occupancy": run.occupancy, "steps": run.steps, "median_latency_s": median(run.latency),
            "median_ttft_s": median(run.ttft), "median_tpot_s": median(run.tpot), "outputs_identical": identical,
            "seconds_per_round": [r.seconds for r in samples], "metrics": run.metrics(goodput)}


# ----------------------------------------------------------------------------------------------
# KV memory on the mixed workload, and a fixed KV budget

def measure_kv_memory(model, workload, ex4, paged_result, batch_size, block_size):
    """Peak slots and utilisation of each KV cache on the workload (all there at once): exercise 4's
    batch and contiguous reservation watched on one more run of exercise 4, the paged pool from the
    paged engine's reported run. Deterministic: the schedule does not depend on the clock."""
    watched = serving.continuous_kv_memory(ex4, model, workload, batch_size)
    paged = serving.paged_kv_memory(paged_result)
    memory = {"paged": {**paged.record(), "block_size": block_size, "peak_blocks": paged_result.stats.peak_blocks}}
    if watched:
        batch, reservation = watched
        memory = {"contiguous_reservation": reservation.record(), "continuous": batch.record(), **memory}
    print(f"\nKV memory at batch size {batch_size}, token slots held (per layer) and the share holding a token, summed over the steps:")
    names = {"contiguous_reservation": "contiguous reservation (prompt + max_new_tokens each)",
             "continuous": "exercise 4, one left-padded batch", "paged": f"exercise 5, paged, blocks of {block_size}"}
    for key, m in memory.items():
        print(f"  {names[key]:<56}{m['peak_slots']:>7} peak slots{m['utilization']:>6.0%} utilised")
    if not watched:
        print("  (exercise 4's running batch could not be watched: this engine is not laid out like the reference's)")
    return memory


def budget_experiment(model, modules, lengths, budget, block_size, requests, repeats, progress=True):
    """The largest batch that a fixed KV budget of `budget` slots fits with contiguous reservation
    (every row may grow to the model's context) and with paging (the largest max_batch_size that runs
    the workload on the same slots, as budget / block_size blocks, without one preemption), and the
    throughput at each, on a workload of `requests` requests all there at once. Returns the record and
    the decode ceiling at the paged batch, measured once a round."""
    ex2, ex4, ex5 = modules["ex2"], modules["ex4"], modules["ex5"]
    context = model.config.n_positions
    num_blocks = budget // block_size
    contiguous = budget // context
    if contiguous < 1:
        raise ValueError(f"--kv-budget {budget} holds no whole context of {context} positions: give at least {context} slots.")
    workload = mixed_workload(model, requests, **lengths)
    print(f"\nKV budget of {budget} token slots ({num_blocks} blocks of {block_size}), {requests} requests all there at once:", flush=True)

    searched = {}

    def fits(batch):
        result = serving.run_paged(ex5, model, workload, batch, num_blocks=num_blocks, block_size=block_size).result
        searched[batch] = {"max_batch": batch, "preemptions": result.stats.preemptions, "peak_blocks": result.stats.peak_blocks}
        print(f"  paged, max batch {batch:>3}: {result.stats.preemptions:>3} preemptions, peak {result.stats.peak_blocks} blocks", flush=True)
        return result.stats.preemptions == 0

    # the contiguous batch always fits the pool: each of its rows needs at most a whole context of blocks
    known_good = contiguous if num_blocks >= contiguous * -(-context // block_size) else 0
    most = min(requests, num_blocks, 512)  # the paged engine's default token budget per step caps the batch at 512
    paged_batch = serving.largest_batch(fits, known_good, most)
    if paged_batch < 1:
        raise ValueError(f"--kv-budget {budget}: the paged engine cannot serve this workload on {num_blocks} blocks without preempting.")

    engines = {"contiguous": lambda: serving.run_continuous(ex4, model, workload, contiguous),
               "paged_same_batch": lambda: serving.run_paged(ex5, model, workload, contiguous, num_blocks=num_blocks, block_size=block_size),
               "paged": lambda: serving.run_paged(ex5, model, workload, paged_batch, num_blocks=num_blocks, block_size=block_size)}
    expected = [ex2.generate(model, p, k, NO_EOS) for p, k in zip(workload.prompts, workload.max_new_tokens)]
    ceilings = Ceilings(model, paged_batch, engines["paged"]())
    samples = take_turns(engines, repeats, "KV budget", progress, after_round=ceilings.measure)
    record = {"slots": budget, "block_size": block_size, "num_blocks": num_blocks, "n_positions": context, "requests": requests,
              "tokens": sum(workload.max_new_tokens), "criterion": "largest max_batch_size without a preemption (bisection)",
              "search": [searched[b] for b in sorted(searched)]}
    for key, batch in (("contiguous", contiguous), ("paged_same_batch", contiguous), ("paged", paged_batch)):
        run = serving.median_run(samples[key])
        record[key] = {"max_batch": batch, "tokens_per_s": run.throughput, "seconds": run.seconds, "steps": run.steps,
                       "outputs_identical": identical(samples[key], expected), "seconds_per_round": [s.seconds for s in samples[key]]}
        if key != "contiguous":
            stats = run.result.stats
            record[key] |= {"peak_blocks": stats.peak_blocks, "preemptions": stats.preemptions, "kv_utilization": stats.kv_utilization}
    record["paged_over_continuous_same_batch"] = median_ratio(samples["contiguous"], samples["paged_same_batch"])
    record["paged_over_contiguous"] = median_ratio(samples["contiguous"], samples["paged"])
    names = {"contiguous": "exercise 4, contiguous (whole contexts)", "paged_same_batch": "exercise 5, paged, same batch",
             "paged": "exercise 5, paged, largest batch"}
    for key, name in names.items():
        r = record[key]
        print(f"  {name:<42} max batch {r['max_batch']:>3}{r['tokens_per_s']:>8.0f} tokens/s  "
              f"{r['outputs_identical']}/{requests} outputs identical")
    same = record["paged_over_continuous_same_batch"]
    print(f"  paged / exercise 4 at the same batch: {same:.2f}x ({'as fast or faster' if same >= 1 else 'SLOWER'}); "
          f"paged at its batch / exercise 4 at its: {record['paged_over_contiguous']:.2f}x (medians of the per-round ratios)")
    return record, ceilings


class Ceilings:
    """Measured once a round, beside the engines: the decode ceiling at batch_size (serving.decode_ceiling) and
    what the paged engine's schedule allows (`paged`, one run of it: its steps as bare forwards, serving.bare_steps).
    Both are deterministic work, so a round's two numbers share that round's machine."""

    def __init__(self, model, batch_size, paged):
        self.model, self.batch_size = model, batch_size
        stats = paged.result.stats
        self.steps, self.tokens = (stats.batch_sizes, stats.scheduled_tokens), paged.tokens
        self.decode, self.schedule = [], []

    def measure(self):
        self.decode.append(serving.decode_ceiling(self.model, self.batch_size))
        self.schedule.append(self.tokens / serving.bare_steps(self.model, *self.steps))

    def record(self):
        """{tokens_per_s, tokens_per_s_per_round, schedule: {tokens_per_s, of_ceiling, ...}}: medians of the rounds;
        of_ceiling is the median of each round's schedule / ceiling."""
        ratios = [s / d for s, d in zip(self.schedule, self.decode)]
        return {"tokens_per_s": statistics.median(self.decode), "tokens_per_s_per_round": self.decode,
                "schedule": {"tokens_per_s": statistics.median(self.schedule), "tokens_per_s_per_round": self.schedule,
                             "of_ceiling": statistics.median(ratios)}}


def ceiling_record(batch_size, runs, ceilings, kv_budget, budget_ceilings):
    """The decode ceiling (median of one measurement a round) at the engines' batch size, and at the
    paged budget batch, with each engine's tokens/s as a share of it; and beside each, what the paged engine's
    schedule allows (Ceilings): the share of the ceiling an engine with nothing around its forwards would make."""
    ceiling = {"batch_size": batch_size, **ceilings.record()}
    tokens_per_s = ceiling["tokens_per_s"]
    ceiling["fraction"] = {label: runs[label].throughput / tokens_per_s
                           for label in ("static", "continuous", "paged", "paged-graphs", "hf-static", "hf-continuous") if label in runs}
    print(f"\nceiling: one bare forward of {batch_size} new tokens, {tokens_per_s:,.0f} tokens/s; "
          + ", ".join(f"{label} {share:.0%}" for label, share in ceiling["fraction"].items())
          + f"; the paged schedule's steps as bare forwards: {ceiling['schedule']['of_ceiling']:.0%}")
    if kv_budget:
        batch = kv_budget["paged"]["max_batch"]
        at = {"batch_size": batch, **budget_ceilings.record()}
        at["fraction_paged"] = kv_budget["paged"]["tokens_per_s"] / at["tokens_per_s"]
        ceiling["at_paged_batch"] = at
        print(f"ceiling at the paged budget batch {batch}: {at['tokens_per_s']:,.0f} tokens/s; paged there {at['fraction_paged']:.0%}; "
              f"its schedule's steps as bare forwards: {at['schedule']['of_ceiling']:.0%}")
    return ceiling


# ----------------------------------------------------------------------------------------------
# The course's evaluation at CPU scale

def course_evaluation(model, modules, requests, input_len, output_len, batch_size, window, load_factors=(0.3, 1.5), rates=None,
                      repeats=3, seed=0, block_size=16, goodput=None, progress=True):
    """The course's serving evaluation on this model: `requests` requests of a fixed input length and
    output lengths drawn from output_len (the course: 32-256), through no batching (one-by-one),
    static, dynamic (a batch starts when full or when its oldest request has waited `window` s),
    continuous and paged batching at batch_size, first all there at once (rate inf), then arriving
    as a Poisson process at each rate: `rates` (requests/s), or load_factors x the capacity, the
    best engine's request throughput at rate inf (below 1: the CPU keeps up; above: it cannot).
    Also the KV memory of each scheme on the rate-inf workload. Returns the record."""
    ex2, ex3, ex4, ex5 = (modules[k] for k in ("ex2", "ex3", "ex4", "ex5"))
    lengths = {"prompt_len": (input_len, input_len), "output_len": tuple(output_len), "seed": seed}

    def engines(w):
        return {"one-by-one": lambda: serving.run_one_by_one(ex2.generate, model, w),
                "static": lambda: serving.run_static(ex3, model, w, batch_size),
                "dynamic": lambda: serving.run_dynamic(ex3, model, w, batch_size, window),
                "continuous": lambda: serving.run_continuous(ex4, model, w, batch_size),
                "paged": lambda: serving.run_paged(ex5, model, w, batch_size, block_size=block_size)}

    def measure(rate, load_factor=None):
        workload = mixed_workload(model, requests, rate=rate, **lengths)
        name = "all at once" if rate is None else f"{rate:.3g} requests/s"
        samples = take_turns(engines(workload), repeats, f"course evaluation, {name}", progress)
        expected = samples["one-by-one"][0].outputs  # exercise 2's reference, each request alone
        entry = {"request_rate": "inf" if rate is None else rate, "load_factor": load_factor, "engines": {}}
        for label, runs in samples.items():
            run = serving.median_run(runs)
            entry["engines"][label] = {"metrics": run.metrics(goodput), "outputs_identical": identical(runs, expected),
                                       "seconds_per_round": [r.seconds for r in runs], "requests": per_request(run)}
        print(f"\n{name}:\n{metrics_table({label: e['metrics'] for label, e in entry['engines'].items()})}", flush=True)
        return entry, workload, serving.median_run(samples["paged"])

    print(f"\nThe course's evaluation: {requests} requests, input {input_len} tokens, outputs {output_len[0]}-{output_len[1]}, "
          f"batch size {batch_size}, dynamic batching window {window * 1e3:g} ms; median of {repeats} rounds", flush=True)
    at_once, workload, paged = measure(None)
    best = max(at_once["engines"], key=lambda label: at_once["engines"][label]["metrics"]["request_throughput"])
    capacity = at_once["engines"][best]["metrics"]["request_throughput"]
    chosen = [(rate, rate / capacity) for rate in rates] if rates else [(factor * capacity, factor) for factor in load_factors]
    entries = [at_once] + [measure(rate, factor)[0] for rate, factor in chosen]
    return {"requests": requests, "input_len": input_len, "output_len": list(output_len), "batch_size": batch_size,
            "window_s": window, "block_size": block_size, "seed": seed, "tokens": sum(workload.max_new_tokens),
            "capacity": {"engine": best, "request_rate": "inf", "request_throughput": capacity,
                         "output_throughput": at_once["engines"][best]["metrics"]["output_throughput"]},
            "load_factors": [factor for _, factor in chosen], "rates": entries,
            "kv_memory": course_kv_memory(model, workload, ex4, paged.result, batch_size)}


def course_kv_memory(model, workload, ex4, paged_result, batch_size):
    """The KV memory of each scheme on the rate-inf workload, each on its own engine's schedule (the
    paged engine's token budget splits long prefills into chunks, exercise 4 does not): tokens held /
    slots held, summed over the steps. "context": every running sequence of the paged run reserves the
    model's whole context (contiguous caches before paging, which cannot know an output's length);
    "reservation": exercise 4's running requests each reserve prompt + max_new_tokens; "batch":
    exercise 4's left-padded batch; "paged": exercise 5's blocks in use."""
    pool = serving.paged_kv_memory(paged_result)
    context = serving.KVMemory([rows * model.config.n_positions for rows in paged_result.stats.batch_sizes], list(pool.tokens))
    kv = {"context": context.record()}
    watched = serving.continuous_kv_memory(ex4, model, workload, batch_size)
    if watched:
        batch, reservation = watched
        kv |= {"reservation": reservation.record(), "batch": batch.record()}
    return kv | {"paged": pool.record()}


# ----------------------------------------------------------------------------------------------
# Speculative decoding at batch 1

def speculative_vs_plain(target, draft, draft_name, ex2, ex7, requests, prompt_len, output_len, k, repeats, seed=0, goodput=None,
                         progress=True):
    """Batch 1, one request after the other: exercise 2's generate against exercise 7's speculative
    decoding (draft proposes k tokens a round, the target verifies), greedy, the same requests.
    Returns the record: both runs' metrics, the speed-up (median of the per-round ratios), the
    acceptance rate and tokens per target forward, and whether the outputs are identical."""
    workload = mixed_workload(target, requests, prompt_len=tuple(prompt_len), output_len=tuple(output_len), seed=seed)
    engines = {"plain": lambda w: serving.run_one_by_one(ex2.generate, target, w),
               "speculative": lambda w: serving.run_speculative(ex7, target, draft, w, k)}
    warm_up = mixed_workload(target, 2, prompt_len=(8, 16), output_len=(8, 16), seed=1)
    for run in engines.values():
        run(warm_up)
    samples = take_turns({label: (lambda run=run: run(workload)) for label, run in engines.items()}, repeats, "batch 1", progress)
    plain, spec = serving.median_run(samples["plain"]), serving.median_run(samples["speculative"])
    counts = spec.result
    record = {"k": k, "draft": draft_name, "draft_parameters": draft.num_parameters(), "requests": requests,
              "prompt_len": list(prompt_len), "output_len": list(output_len), "tokens": sum(workload.max_new_tokens),
              "plain": plain.metrics(goodput), "speculative": spec.metrics(goodput),
              "speedup": median_ratio(samples["plain"], samples["speculative"]),
              "acceptance_rate": counts["accepted"] / counts["drafted"] if counts["drafted"] else 0.0,
              "tokens_per_target_forward": counts["generated"] / counts["target_forwards"],
              "outputs_identical": identical(samples["speculative"], plain.outputs),
              "seconds_per_round": {label: [r.seconds for r in runs] for label, runs in samples.items()}}
    print(f"\nbatch 1, {requests} requests: plain {record['plain']['output_throughput']:,.0f} tokens/s, speculative (k={k}, "
          f"{draft_name}) {record['speculative']['output_throughput']:,.0f} tokens/s: {record['speedup']:.2f}x; acceptance "
          f"{record['acceptance_rate']:.0%}, {record['tokens_per_target_forward']:.2f} tokens per target forward, "
          f"{record['outputs_identical']}/{requests} outputs identical", flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# Sampling against greedy decoding

def sampled_vs_greedy(model, ex5, workload, batch_size, temperature, repeats, seed=0, block_size=16, goodput=None, progress=True):
    """Exercise 5's engine on `workload` (all there at once, the end-of-text token ignored, so both do
    the same work) greedy and sampling at `temperature` (OpenAI's default 1: top-k, top-p, min-p off;
    request i seeded seed + i), taking turns. Returns the record: both runs' metrics and the ratio
    sampled / greedy of the output throughputs (median of the per-round ratios)."""
    from workshop.serving.sampling import SamplingParams

    sampling = [SamplingParams(temperature=temperature, seed=seed + i) for i in range(len(workload))]
    engines = {"greedy": lambda w, s=None: serving.run_paged(ex5, model, w, batch_size, block_size=block_size, sampling=s),
               "sampled": lambda w, s=sampling: serving.run_paged(ex5, model, w, batch_size, block_size=block_size,
                                                                 sampling=s[:len(w)])}
    warm_up = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    for run in engines.values():
        run(warm_up)
    samples = take_turns({label: (lambda run=run: run(workload)) for label, run in engines.items()}, repeats, "sampled vs greedy",
                         progress)
    greedy, sampled = serving.median_run(samples["greedy"]), serving.median_run(samples["sampled"])
    ratios = [a.metrics()["output_throughput"] / b.metrics()["output_throughput"] for a, b in zip(samples["sampled"], samples["greedy"])]
    record = {"engine": "paged", "temperature": temperature, "requests": len(workload), "batch_size": batch_size,
              "greedy": greedy.metrics(goodput), "sampled": sampled.metrics(goodput), "sampled_over_greedy": statistics.median(ratios),
              "ratio_per_round": ratios, "seconds_per_round": {label: [r.seconds for r in runs] for label, runs in samples.items()}}
    print(f"\npaged engine, {len(workload)} requests all at once: greedy {record['greedy']['output_throughput']:,.0f} tokens/s, "
          f"temperature {temperature:g} {record['sampled']['output_throughput']:,.0f} tokens/s: sampled / greedy "
          f"{record['sampled_over_greedy']:.2f} (median of the per-round ratios)", flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# Overlap scheduling on against off

def overlap_on_vs_off(model, module, workload, batch_size, repeats, block_size=16, progress=True):
    """The paged engine with overlap scheduling (workshop/serving/overlap.py: step n+1 scheduled and launched before
    step n's tokens are read) and without, on `workload` all there at once, taking turns after a warm-up: on CUDA
    exercise 11's engine (`module`, paged-graphs), elsewhere exercise 5's (`module`, paged), where the host is the
    device and overlap has nothing to hide (off by default there). Returns the record: both runs' output
    throughputs, on / off (median of the per-round ratios), and whether the outputs were the same."""
    cuda = model.device.type == "cuda"
    label = "paged-graphs" if cuda else "paged"
    run = ((lambda w, overlap: serving.run_paged_graphs(module, model, w, batch_size, block_size=block_size, overlap=overlap)) if cuda else
           (lambda w, overlap: serving.run_paged(module, model, w, batch_size, block_size=block_size, overlap=overlap)))
    engines = {"on": lambda w: run(w, True), "off": lambda w: run(w, False)}
    warm_up = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    for engine in engines.values():
        engine(warm_up)
    samples = take_turns({name: (lambda engine=engine: engine(workload)) for name, engine in engines.items()}, repeats,
                         "overlap on vs off", progress)
    ratios = [on.throughput / off.throughput for on, off in zip(samples["on"], samples["off"])]
    on, off = serving.median_run(samples["on"]), serving.median_run(samples["off"])
    record = {"engine": label, "requests": len(workload), "batch_size": batch_size, "on_tokens_per_s": on.throughput,
              "off_tokens_per_s": off.throughput, "on_over_off": statistics.median(ratios), "ratio_per_round": ratios,
              "outputs_identical": all(r.outputs == samples["off"][0].outputs for r in samples["on"] + samples["off"]),
              "seconds_per_round": {name: [r.seconds for r in runs] for name, runs in samples.items()}}
    print(f"\n{label} engine, {len(workload)} requests all at once: overlap on {record['on_tokens_per_s']:,.0f} tokens/s, off "
          f"{record['off_tokens_per_s']:,.0f} tokens/s: on / off {record['on_over_off']:.2f} (median of the per-round ratios), "
          f"outputs {'the same' if record['outputs_identical'] else 'DIFFERENT'}", flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# Where a step goes

def step_split(model, modules, workload, batch_size, block_size=16, progress=True):
    """Each stepping engine (exercise 4's continuous, exercise 5's paged, and on CUDA exercise 11's paged-graphs) on
    `workload`, watched by workshop.serving.step_split: the time per step in the model's forward, sampling, scheduling
    and bookkeeping (one run, every watched call synchronised), then the host reads per step (another run). Apart from
    the throughput runs, which the watching would slow. Returns the record."""
    from workshop.serving.step_split import StepSplit

    engines = {"continuous": (modules["ex4"], lambda: modules["ex4"].Engine(model, batch_size, eos_token_id=NO_EOS)),
               "paged": (modules["ex5"], lambda: modules["ex5"].Engine(model, batch_size, block_size=block_size, eos_token_id=NO_EOS))}
    if modules.get("ex11") is not None and model.device.type == "cuda":
        engines["paged-graphs"] = (modules["ex11"], lambda: modules["ex11"].Engine(model, batch_size, block_size=block_size,
                                                                                   eos_token_id=NO_EOS))
    warm_up = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    record = {"batch_size": batch_size, "requests": len(workload), "engines": {}}
    for label, (module, build) in tqdm(engines.items(), desc="step split", disable=not progress):
        request = getattr(module, "Request", None) or module.paged.Request  # exercise 11 takes exercise 5's requests
        requests = lambda w: [request(p, n) for p, n in zip(w.prompts, w.max_new_tokens)]
        build().run(requests(warm_up))
        measured = {}
        for counting in (False, True):
            engine = build()
            with StepSplit(engine, module, reads=counting) as split:
                engine.run(requests(workload))
            measured |= split.record()
        record["engines"][label] = measured
        parts = measured["ms_per_step"]
        print(f"  {label:<12} {measured['step_ms']:.2f} ms per step: " + ", ".join(f"{part} {parts[part]:.2f} ms "
              f"({measured['share'][part]:.0%})" for part in parts) + f"; host reads per step {measured['host_reads_per_step']['total']:.2f}",
              flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# The server against the same engine in this process

def online_vs_offline(model, base_url, requests, prompt_len, output_len, rate, batch_size, repeats, ignore_eos=False, seed=0,
                      goodput=None, progress=True):
    """The same requests (prompt_len, output_len, arriving at `rate` per second; None: all at once)
    sent to the server at base_url (serve.py: exercise 5's reference engine at max batch `batch_size`)
    and run by that engine in this process, taking turns. Both run with the end-of-text token as the
    server does (or both ignore it with ignore_eos, which the server must accept), greedy, so both
    do the same work. Returns the record: both runs' metrics and the ratio online / offline of the
    output throughputs (median of the per-round ratios)."""
    from workshop.serving.client import run_online, served_model

    ex5 = implementation("ex5_paged_kv_cache", "solutions")  # the server's engine
    eos = NO_EOS if ignore_eos else gpt.EOS_TOKEN_ID
    workload = mixed_workload(model, requests, prompt_len=tuple(prompt_len), output_len=tuple(output_len), rate=rate, seed=seed)
    name = served_model(base_url)
    engines = {"online": lambda w: run_online(base_url, w, name, ignore_eos, progress=progress),
               "offline": lambda w: serving.run_paged(ex5, model, w, batch_size, eos_token_id=eos)}
    warm_up = mixed_workload(model, 2, prompt_len=(8, 16), output_len=(4, 8), seed=1)
    for run in engines.values():
        run(warm_up)
    samples = take_turns({label: (lambda run=run: run(workload)) for label, run in engines.items()}, repeats, "online vs offline",
                         progress)
    online, offline = serving.median_run(samples["online"]), serving.median_run(samples["offline"])
    tokenizer = gpt.load_tokenizer()
    texts = [tokenizer.decode(out) for out in offline.outputs]
    ratios = [a.metrics()["output_throughput"] / b.metrics()["output_throughput"] for a, b in zip(samples["online"], samples["offline"])]
    record = {"base_url": base_url, "model": name, "requests": requests, "prompt_len": list(prompt_len),
              "output_len": list(output_len), "request_rate": "inf" if rate is None else rate, "batch_size": batch_size,
              "ignore_eos": ignore_eos, "engine": "exercise 5's reference (paged)",
              "online": online.metrics(goodput), "offline": offline.metrics(goodput),
              "online_over_offline": statistics.median(ratios), "ratio_per_round": ratios,
              "outputs_identical": min(sum(a == b for a, b in zip(run.outputs, texts)) for run in samples["online"]),
              "failed": max(run.metrics()["failed"] for run in samples["online"])}
    print(f"\nonline vs offline, {requests} requests {'all at once' if rate is None else f'at {rate:g} requests/s'}:\n"
          f"{metrics_table({'online (serve.py)': record['online'], 'offline (same engine)': record['offline']})}\n"
          f"online / offline output throughput: {record['online_over_offline']:.2f} (median of the per-round ratios); "
          f"{record['outputs_identical']}/{requests} answers identical to the engine's offline output", flush=True)
    return record


# ----------------------------------------------------------------------------------------------
# Targets, rows, tables

def targets(data):
    """The issue's targets, read off a record (results/serving.json's data): each with what was
    measured, the target, and whether it was met (None where the run left that part out)."""
    engines, out = data.get("engines", {}), {}
    ours = [label for label in OURS if label in engines]
    if ours:
        best = max(ours, key=lambda label: engines[label]["metrics"]["output_throughput"])
        for key, baseline, goal in (("best_over_hf_generate", "hf-static", 2.0), ("best_over_hf_generate_batch", "hf-continuous", 1.5)):
            if baseline in engines:
                ratio = statistics.median(a / b for a, b in zip(engines[baseline]["seconds_per_round"], engines[best]["seconds_per_round"]))
                out[key] = {"engine": best, "baseline": baseline, "ratio": ratio, "target": goal, "met": ratio >= goal}
                schedule = data.get("ceiling", {}).get("schedule")
                if schedule and best == "paged":  # the most an engine on the paged schedule could make over the baseline
                    out[key]["schedule_allows"] = schedule["tokens_per_s"] / engines[baseline]["tokens_per_s"]
    gpu = "paged-graphs" in engines  # exercise 11's engine runs on CUDA only: the GPU's targets, not the CPU's
    if gpu and "hf-continuous" in engines:
        ratio = statistics.median(a / b for a, b in zip(engines["hf-continuous"]["seconds_per_round"], engines["paged-graphs"]["seconds_per_round"]))
        out["paged_graphs_over_hf_generate_batch"] = {"engine": "paged-graphs", "baseline": "hf-continuous", "ratio": ratio, "target": 4.0,
                                                      "met": ratio >= 4.0}
    ceiling = data.get("ceiling")
    engine, goal = ("paged-graphs", 0.8) if gpu else ("paged", 0.75)  # issue 35: the engine near its decode ceiling
    if ceiling and engine in ceiling.get("fraction", {}):
        share = ceiling["fraction"][engine]
        out["paged_of_ceiling"] = {"engine": engine, "batch_size": ceiling["batch_size"], "ratio": share, "target": goal, "met": share >= goal}
        if "at_paged_batch" in ceiling and not gpu:
            at = ceiling["at_paged_batch"]
            out["paged_of_ceiling_at_budget_batch"] = {"engine": "paged", "batch_size": at["batch_size"],
                                                       "ratio": at["fraction_paged"], "target": 0.6, "met": at["fraction_paged"] >= 0.6}
        for key, record in (("paged_of_ceiling", ceiling), ("paged_of_ceiling_at_budget_batch", ceiling.get("at_paged_batch"))):
            if key in out and "schedule" in record:  # the share of the ceiling the paged schedule allows at all
                out[key]["schedule_allows"] = record["schedule"]["of_ceiling"]
    evaluation = data.get("evaluation")
    if evaluation:
        kv = evaluation["kv_memory"]
        paged, context = kv["paged"]["utilization"], kv["context"]["utilization"]
        reserve = kv["reservation"]["utilization"] if "reservation" in kv else None
        out["paged_kv_utilization"] = {"paged": paged, "contiguous_context": context, "contiguous_max_new_tokens": reserve,
                                       "target": "paged > 0.9 where contiguous < 0.5", "met": paged > 0.9 and context < 0.5}
    sampling = data.get("sampling")
    if sampling:
        goal = 0.9 if gpu else 0.95
        out["sampled_over_greedy"] = {"engine": sampling["engine"], "temperature": sampling["temperature"],
                                      "ratio": sampling["sampled_over_greedy"], "target": goal, "met": sampling["sampled_over_greedy"] >= goal}
    if data.get("online"):
        out["server_overhead"] = [{"model": o["model"], "online_over_offline": o["online_over_offline"], "target": 0.8,
                                   "met": o["online_over_offline"] >= 0.8 and o["failed"] == 0} for o in data["online"]]
    return out


def rows(data):
    """The record as one row per engine and load: engine, mode (offline / online), scenario, request
    rate ("inf" or requests/s), batch size, then vLLM's metrics."""
    out = []

    def add(engine, mode, scenario, rate, batch_size, metrics):
        out.append({"engine": engine, "mode": mode, "scenario": scenario, "request_rate": rate, "batch_size": batch_size,
                    **{key: metrics.get(key) for key in METRICS if key in metrics}})

    workload = data.get("workload", {})
    for label, e in data.get("engines", {}).items():
        rate = workload.get("rate") if label == "continuous-poisson" else "inf"
        add(label, "offline", "mixed", rate, 1 if label == "one-by-one" else workload.get("batch_size"), e["metrics"])
    evaluation = data.get("evaluation")
    for entry in evaluation["rates"] if evaluation else []:
        for label, e in entry["engines"].items():
            add(label, "offline", "course", entry["request_rate"], 1 if label == "one-by-one" else evaluation["batch_size"], e["metrics"])
    sampling = data.get("sampling")
    if sampling:
        add(f"{sampling['engine']}, greedy", "offline", "mixed", "inf", sampling["batch_size"], sampling["greedy"])
        add(f"{sampling['engine']}, temperature {sampling['temperature']:g}", "offline", "mixed", "inf", sampling["batch_size"],
            sampling["sampled"])
    spec = data.get("speculative")
    if spec:
        add("plain", "offline", "batch-1", "inf", 1, spec["plain"])
        add(f"speculative-k{spec['k']}", "offline", "batch-1", "inf", 1, spec["speculative"])
    for online in data.get("online", []):
        for mode in ("online", "offline"):
            add(f"paged, {online['model']}" + (" (serve.py)" if mode == "online" else ""), mode, "server", online["request_rate"],
                online["batch_size"], online[mode])
    return out


def write_rows(rows, path):
    """Write `rows` as JSON (a list) and as CSV: path's suffix picks one, the other goes beside it with
    the other suffix. Returns both paths."""
    path = Path(path)
    json_path, csv_path = (path.with_suffix(".json"), path) if path.suffix == ".csv" else (path, path.with_suffix(".csv"))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rows, indent=1) + "\n")
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    return json_path, csv_path


COLUMNS = (("ok", None), ("req/s", "request_throughput"), ("out tok/s", "output_throughput"), ("total tok/s", "total_token_throughput"),
           ("goodput req/s", "request_goodput"), ("TTFT mean", "mean_ttft_ms"), ("TTFT median", "median_ttft_ms"),
           ("TTFT p99", "p99_ttft_ms"), ("TPOT mean", "mean_tpot_ms"), ("TPOT median", "median_tpot_ms"), ("TPOT p99", "p99_tpot_ms"),
           ("ITL mean", "mean_itl_ms"), ("ITL median", "median_itl_ms"), ("ITL p99", "p99_itl_ms"), ("E2EL mean", "mean_e2el_ms"),
           ("E2EL median", "median_e2el_ms"), ("E2EL p99", "p99_e2el_ms"))


def _cells(metrics):
    cells = []
    for title, key in COLUMNS:
        if key is None:
            cells.append(f"{metrics['completed']}/{metrics['completed'] + metrics['failed']}")
        elif key == "request_goodput" and key not in metrics:
            cells.append("-")
        else:
            value = metrics.get(key)
            cells.append("-" if value is None else f"{value:,.2f}" if key == "request_throughput" or key.startswith("request") else
                         f"{value:,.0f}" if "throughput" in key else f"{value:,.1f}")
    return cells


def metrics_table(by_label, markdown=False):
    """{label: metrics} as a table: completed/sent, throughputs, goodput, mean / median / p99 of TTFT,
    TPOT, ITL and E2EL (ms). Text for the terminal, or Markdown."""
    header = ["engine"] + [title for title, _ in COLUMNS]
    body = [[label] + _cells(m) for label, m in by_label.items()]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(COLUMNS)) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                     for row in [header] + body)


RESULT = (("Successful requests:", "completed", "{:d}"), ("Failed requests:", "failed", "{:d}"),
          ("Benchmark duration (s):", "duration", "{:.2f}"), ("Total input tokens:", "total_input_tokens", "{:d}"),
          ("Total generated tokens:", "total_output_tokens", "{:d}"), ("Request throughput (req/s):", "request_throughput", "{:.2f}"),
          ("Request goodput (req/s):", "request_goodput", "{:.2f}"), ("Output token throughput (tok/s):", "output_throughput", "{:.2f}"),
          ("Total Token throughput (tok/s):", "total_token_throughput", "{:.2f}"))
SECTIONS = {"ttft": ("Time to First Token", "TTFT"), "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
            "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}


def format_result(metrics, title="Serving Benchmark Result"):
    """One run's metrics laid out as vLLM's `bench serve` prints them."""
    lines = [f"{' ' + title + ' ':=^50}"]
    lines += [f"{name:<40}{fmt.format(metrics[key]):<10}" for name, key, fmt in RESULT if key in metrics]
    for key, (section, short) in SECTIONS.items():
        lines.append(f"{section:-^50}")
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            value = metrics.get(f"{stat}_{key}_ms")
            shown = "-" if value is None else f"{value:.2f}"
            lines.append(f"{f'{name} {short} (ms):':<40}{shown:<10}")
    return "\n".join(lines + ["=" * 50])


def rate_name(rate):
    return "all at once (inf)" if rate == "inf" else f"{rate:.3g} requests/s"
