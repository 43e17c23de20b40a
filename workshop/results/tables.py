"""The Markdown tables that docs quote from results files (see workshop/results/store.py): one function
per table, registered with @table(results_file, table_name)."""

import statistics

TABLES = {}  # (file, name) -> function(record) -> Markdown


def table(file, name):
    """Register a function that draws a Markdown table from a results file's record."""
    def register(fn):
        TABLES[file, name] = fn
        return fn
    return register


# ----------------------------------------------------------------------------------------------
# results/figures.json (scripts/make_figures.py): the numbers the slides quote

@table("timed_generate", "kv_speedup")
def _kv_speedup(record):
    lengths = sorted(record["data"]["lengths"], key=int)
    rows = ["| new tokens | " + " | ".join(lengths) + " |", "|---" * (len(lengths) + 1) + "|",
            "| KV-cache speed-up | " + " | ".join(f"{record['data']['lengths'][n]['speedup']:.1f}×" for n in lengths) + " |"]
    return "\n".join(rows)


@table("figures", "sweep")
def _sweep(record):
    s = record["data"]["sweep"]
    rows = ["| max batch size | occupancy static → continuous | steps static → continuous | throughput, continuous / static |",
            "|---|---|---|---|"]
    for b in s["batch_sizes"]:
        st, co = s["static"][str(b)], s["continuous"][str(b)]
        rows.append(f"| {b} | {st['occupancy']:.0%} → {co['occupancy']:.0%} | {st['steps']} → {co['steps']} | "
                    f"{s['continuous_over_static'][str(b)]:.2f}× |")
    return "\n".join(rows)


@table("figures", "bpe_worked_example")
def _bpe_worked_example(record):
    from workshop.figures import bpe as bpe_plots

    return bpe_plots.worked_example_markdown(record["data"]["bpe_worked_example"])


# ----------------------------------------------------------------------------------------------
# timed_generate.py and bench/serving.py (results/timed_generate.json, results/serving.json)

def _seconds(value):
    """A duration for a table: ms below one second, else s; '-' when the engine does not report it."""
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


@table("timed_generate", "lengths")
def timed_generate_lengths(record):
    rows = ["| new tokens | naive (s) | KV cache (s) | speed-up | token positions through the model, naive vs KV |",
            "|---|---|---|---|---|"]
    for n, r in sorted(record["data"]["lengths"].items(), key=lambda item: int(item[0])):
        rows.append(f"| {n} | {r['naive_s']:.3f} | {r['kv_cache_s']:.3f} | {r['speedup']:.1f}x "
                    f"| {r['naive_token_passes']:,} vs {r['kv_cache_token_passes']:,} |")
    return "\n".join(rows)


SERVING_ENGINES = {  # results/serving.json's engine labels, as a reader knows them
    "one-by-one": "exercise 2, KV cache, one request after the other",
    "hf-static": "transformers `generate`, padded static batches",
    "hf-continuous": "transformers continuous batching (`generate_batch`'s engine)",
    "static": "exercise 3, static batching",
    "continuous": "exercise 4, continuous batching",
    "continuous-poisson": "exercise 4, Poisson arrivals at {rate:g} requests/s",
    "paged": "exercise 5, paged KV cache",
    "paged-graphs": "exercise 11, paged, decode steps on CUDA graphs",
}


@table("serving", "engines")
def serving_engines(record):
    workload = record["data"]["workload"]
    rows = ["| engine | tokens/s | occupancy | steps | median latency | median TTFT | median TPOT | outputs identical |",
            "|---|---|---|---|---|---|---|---|"]
    engines = record["data"]["engines"]
    for label in sorted(engines, key=lambda label: list(SERVING_ENGINES).index(label) if label in SERVING_ENGINES else 99):
        e = engines[label]
        name = SERVING_ENGINES.get(label, label).format(rate=workload["rate"] or 0)
        occupancy = "-" if e["occupancy"] is None else f"{e['occupancy']:.0%}"
        rows.append(f"| {name} | {e['tokens_per_s']:,.0f} | {occupancy} | {e['steps'] if e['steps'] is not None else '-'} "
                    f"| {_seconds(e['median_latency_s'])} | {_seconds(e['median_ttft_s'])} | {_seconds(e['median_tpot_s'])} "
                    f"| {e['outputs_identical']}/{workload['requests']} |")
    return "\n".join(rows)


SERVING_KV_MEMORY = {  # results/serving.json's data.kv_memory keys, as a reader knows them
    "contiguous_reservation": "contiguous reservation: prompt + max_new_tokens per request, on exercise 4's schedule",
    "continuous": "exercise 4: one left-padded batch, rows x longest row",
    "paged": "exercise 5: paged, blocks of {block_size}",
}


@table("serving", "kv_memory")
@table("serving_h200", "kv_memory")
def serving_kv_memory(record):
    memory = record["data"]["kv_memory"]
    rows = ["| KV cache | peak token slots | slots holding a token |", "|---|---|---|"]
    for key, name in SERVING_KV_MEMORY.items():
        if key in memory:
            m = memory[key]
            rows.append(f"| {name.format(block_size=m.get('block_size'))} | {m['peak_slots']:,} | {m['utilization']:.0%} |")
    return "\n".join(rows)


@table("serving", "kv_budget")
def serving_kv_budget(record):
    b = record["data"]["kv_budget"]
    names = {"contiguous": f"exercise 4, contiguous: each row may grow to {b['n_positions']:,} positions",
             "paged_same_batch": "exercise 5, paged, the same batch",
             "paged": "exercise 5, paged, the largest batch without a preemption"}
    rows = [f"| engine | batch in {b['slots']:,} slots | tokens/s | outputs identical |", "|---|---|---|---|"]
    for key, name in names.items():
        r = b[key]
        rows.append(f"| {name} | {r['max_batch']} | {r['tokens_per_s']:,.0f} | {r['outputs_identical']}/{b['requests']} |")
    return "\n".join(rows)


SERVING_THROUGHPUT = ("one-by-one", "static", "continuous", "paged", "paged-graphs", "hf-static", "hf-continuous")  # everything there at once


@table("serving_h200", "throughput")
@table("serving_h100", "throughput")
def serving_throughput(record):
    """Each engine's output tokens/s on the workload all there at once, its gain over one request at a time
    (the median over rounds of one-by-one's seconds / its own, as bench/serving.py's data.speedups) and a
    request's median time per output token: one decode step of the batch the request was in."""
    engines = record["data"]["engines"]
    alone = engines["one-by-one"]["seconds_per_round"]
    rows = ["| engine | output tokens/s | × one-by-one | median time per output token |", "|---|---|---|---|"]
    for label in SERVING_THROUGHPUT:
        if label not in engines:
            continue
        e = engines[label]
        gain = statistics.median(a / b for a, b in zip(alone, e["seconds_per_round"]))
        tpot = e.get("metrics", {}).get("median_tpot_ms")
        rows.append(f"| {SERVING_ENGINES[label]} | {e['tokens_per_s']:,.0f} | {gain:.1f}× "
                    f"| {'-' if tpot is None else f'{tpot:.1f} ms'} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# Module 11, CUDA graphs (bench/cuda_graphs.py on a GPU)

GRAPH_ENGINES = {"ex5": "exercise 5's engine", "graphs_off": "exercise 11's engine, graphs off",
                 "graphs_on": "exercise 11's engine, decode steps replayed"}


@table("cuda_graphs_h100", "steps")
@table("cuda_graphs_float16_h100", "steps")
def graph_steps(record):
    """One decode step at each batch: exercise 5's forward, DecodeGraphs eager and replayed (medians of rotating
    rounds; the gain is the median per-round ratio to exercise 5)."""
    data = record["data"]
    rows = ["| decode step | exercise 5 | exercise 11, eager | exercise 11, replayed | replayed: × exercise 5 |", "|---|---|---|---|---|"]
    for batch, paths in data["steps"].items():
        rows.append(f"| batch {batch} | {paths['ex5']['ms']:.2f} ms | {paths['eager']['ms']:.2f} ms | {paths['replayed']['ms']:.2f} ms "
                    f"| {paths['replayed']['over_ex5']:.1f}× |")
    return "\n".join(rows)


@table("cuda_graphs_h100", "engine")
@table("cuda_graphs_float16_h100", "engine")
def graph_engines(record):
    """The engine part: every request there at once, the engines taking turns; tokens/s of the median round."""
    rows = ["| engine | output tokens/s | × exercise 5 | outputs as exercise 5's |", "|---|---|---|---|"]
    for label, e in record["data"]["engine"]["engines"].items():
        rows.append(f"| {GRAPH_ENGINES.get(label, label)} | {e['tokens_per_s']:,.0f} | {e['over_ex5']:.2f}× | {e['outputs_identical']}/{e['requests']} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# Module 5, the paged KV cache (results/figures.json, scripts/make_figures.py --module 5)

KV_SIZE_MODELS = {"tiny": "tiny (ours)", "gpt2": "GPT-2 124M", "gpt2-xl": "GPT-2 XL"}


def _bytes(n):
    """A size in the largest binary unit that keeps it at 1 or more: 36 KiB, 300 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if n == int(n) else f"{n:,.1f} {unit}"
        n /= 1024


@table("figures", "kv_size")
def _kv_size(record):
    sizes = record["data"]["kv_size"]
    rows = ["| model | layers | heads × head_dim | per token, fp16 | per token, fp32 | context | full context, fp16 |",
            "|---|---|---|---|---|---|---|"]
    for key, name in KV_SIZE_MODELS.items():
        s = sizes[key]
        rows.append(f"| {name} | {s['n_layer']} | {s['n_head']} × {s['head_dim']} | {_bytes(s['bytes_per_token_16bit'])} "
                    f"| {_bytes(s['bytes_per_token_32bit'])} | {s['n_positions']:,} | {_bytes(s['context_bytes_16bit'])} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# results/mutation.json (scripts/mutation_score.py): how many planted bugs each checker catches

@table("mutation", "scores")
def mutation_scores(record):
    rows = ["| exercise | mutants of the TODO parts | sampled | killed | equivalent | score | 95% interval | minutes |",
            "|---|---|---|---|---|---|---|---|"]
    for exercise, e in sorted(record["data"].items(), key=lambda kv: int(kv[0].split("_")[0][2:])):
        score = f"{e['score']:.0%}" if e["score"] is not None else "n/a"
        low, high = e["interval_95"]
        rows.append(f"| {exercise} | {e['mutants']} | {e['sampled']} | {e['killed']} | {e['equivalent']} | {score} | "
                    f"{low:.0%}-{high:.0%} | {e['seconds'] / 60:.1f} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# results/test_suite.json (scripts/time_test_suite.py --checkers): each checker as a student runs it

@table("test_suite", "checkers")
def checker_times(record):
    rows = ["| checker | checks | whole checker, wall | CPU | its differential checks |", "|---|---|---|---|---|"]
    for exercise, e in sorted(record["data"]["checkers"].items(), key=lambda kv: (int(kv[0].split("_")[0][2:]), kv[0])):
        rows.append(f"| `test_{exercise}.py` | {e['passed']}/{e['checks']} passed | {e['wall_s']:.0f} s | {e['cpu_s']:.0f} s | "
                    f"{e['differential_s']:.1f} s |")
    return "\n".join(rows)
