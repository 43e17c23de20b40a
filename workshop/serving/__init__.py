"""Serving: the engines' sampler, their workloads, serving runs and their metrics, the HTTP server, and
the serving benchmark.

    sampling   the engines' batched sampler (given code: exercise 6 teaches its pieces)
    workloads  seeded prompts and serving workloads (mixed lengths, Poisson arrivals)
    runs       a serving run's per-request records and metrics: timelines, throughput, TTFT, TPOT, ITL
    server     the OpenAI-compatible streaming server in front of the paged engine (serve.py)
    bench      the serving benchmark's parts (bench/serving.py)
    client     the online client: an OpenAI-compatible server driven with AsyncOpenAI (bench/serve_bench.py)
    report     the benchmark's tables and docs/benchmarks.md
"""
