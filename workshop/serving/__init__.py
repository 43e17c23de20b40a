"""Serving: the engines' sampler, their workloads, serving runs and their metrics, the HTTP server, and
the serving benchmark.

    sampling     the engines' batched sampler (given code: exercise 6 teaches its pieces)
    workloads    seeded prompts and serving workloads (mixed lengths, Poisson arrivals)
    runs         a serving run's per-request records and metrics: timelines, throughput, TTFT, TPOT, ITL
    engine_core  the paged engine in a process of its own, driven by commands over a pipe (the server's)
    server       the OpenAI-compatible streaming server in front of it (serve.py)
    bench        the serving benchmark's parts (bench/serving.py)
    client       the online client: an OpenAI-compatible server driven over HTTP with aiohttp (bench/serve_bench.py)
    report       the benchmark's tables and docs/benchmarks.md
"""
