"""Serving: the engines' sampler, their workloads, serving runs and their metrics, the HTTP server (split by
job, as vLLM's OpenAI entrypoints are), and the serving benchmark.

    sampling        the engines' batched sampler (given code: exercise 6 teaches its pieces)
    workloads       seeded prompts and serving workloads (mixed lengths, Poisson arrivals)
    overlap         overlap scheduling over exercise 5's or 11's engine: step n+1 scheduled while step n runs
    step_split      where an engine's step goes (forward, sampling, scheduling, bookkeeping) and its host reads
    runs            a serving run's per-request records and metrics: timelines, throughput, TTFT, TPOT, ITL
    engine_core     the paged engine in a process of its own, driven by commands over a pipe (the server's)
    server          the OpenAI-compatible streaming server in front of it: the app, its routes and body limit (serve.py)
    protocol        the server's request bodies and OpenAI's error object
    openai_serving  what the server's endpoints do with a request: tokenize, check, submit, collect or stream
    engine_client   the server's side of the engine core: add / abort, the output thread (token ids -> text)
    stop_checker    incremental detokenization with exercise 6's stop rules (one per choice)
    metrics         the server's Prometheus metrics (GET /metrics), under vLLM's names
    bench           the serving benchmark's parts (bench/serving.py)
    client          the online client: an OpenAI-compatible server driven over HTTP with aiohttp (bench/serve_bench.py)
    report          the benchmark's tables and docs/benchmarks.md
"""
