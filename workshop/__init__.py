"""The workshop's shared library: what the checkers, notebooks, decks' figures, benchmarks and the server
use. Entry points (serve.py, timed_generate.py, scripts/, bench/) only call it.

    grading/       the checkers' harness: the implementation switch, cost counters, paired timings, messages
    serving/       the engines' sampler, workloads, serving runs and metrics, the HTTP server, the benchmark
    figures/       measuring and drawing what the notebooks and decks show, one module per course module
    results/       results files and the docs' numbers filled from them
    tokenizers     GPT-2's tokenizer files offline, and the outside tokenizers (tiktoken, the tokenizers library)
    training       training the small embedded GPT-2s (scripts/train.py)
    quantization   measuring a quantized model: bytes, perplexity, greedy agreement, torch.ao's int8 (module 8)
    distributed    several processes joined by torch.distributed, and the collectives they run (module 9)
    attention      a memory that counts the bytes read and written (module 10's given code)
    graphs         capture a step once and replay it: CUDA graphs, and a CPU stand-in with their rules (module 11)
    replay         module 11's measurements: a decode step's kernels, eager against replayed steps, the engine with
                   and without graphs, padding waste against the capture sizes (bench/cuda_graphs.py)
    fusion         module 12's measurements: a step's kernels eager against compiled (torch.profiler), the engine
                   with its pieces compiled and on piecewise graphs (bench/piecewise_graphs.py)
    engine_failure an engine whose step raised is dead: it refuses every later call with one sentence (EngineFailed)
    host_reads     counting the times code reads a tensor's values on the host (a sync on a GPU)
    bandwidth      batch-1 decode against the memory-bandwidth limit: copy bandwidth, bytes a step reads, step time
    gpu_check      the GPU check's machinery: steps in process groups with time limits, nvidia-smi's state, summaries
    data/          the held-out text the benchmarks measure on
"""
