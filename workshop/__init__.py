"""The workshop's shared library: what the checkers, notebooks, slides' figures and benchmarks use.

    harness           which implementation is graded, cost counters, paired timings, teaching messages
    batch_checks      "as if run alone": the comparison behind the batching checkers (exercises 3-4)
    workloads         seeded prompts and serving workloads (mixed lengths, Poisson arrivals)
    serving           serving runs and their metrics: timelines, throughput, TTFT, TPOT
    generation_plots  measuring and drawing naive vs KV-cache generation (modules 1-2)
    serving_plots     drawing timelines, sweeps and latency distributions (modules 3-4)
    training          training the small embedded GPT-2s (scripts/train.py)
    bpe_tools         GPT-2's tokenizer files offline, tiktoken and the tokenizers library's trainer (exercise 0)
    bpe_plots         measuring and drawing byte pair encoding (module 0)
    quantization      measuring a quantized model: bytes, perplexity, greedy agreement, torch.ao's int8 (exercise 8)
    quantization_plots  drawing number formats, granularity, the outlier, zero points (module 8)
"""
