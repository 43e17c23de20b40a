"""Figures: measuring and drawing what the notebooks and the decks show, one module per course module
(decks registers the decks' figures, drawn with them; scripts/make_figures.py calls it).

    decks         the decks' figures: the @figure registry, their Context, drawn_from, draw() into slides/figures
    generation    shared style (fonts, readable sizes, save at 200 dpi), naive vs KV-cache generation (modules 1-2)
    bpe           byte pair encoding (module 0)
    serving       timelines, sweeps and latency distributions (modules 3-4, the serving benchmark)
    paging        block tables, the gather, KV memory and waste (module 5)
    sampling      logits processors, beam search, streaming (module 6)
    constrained   constrained decoding's masks (module 6)
    speculative   speculative decoding's rounds, rejection sampling and speed-up (module 7)
    quantization  number formats, granularity, the outlier, zero points (module 8)
    parallel      tensor-parallel sharding and communication (module 9)
    attention     tiles, the online softmax, split-KV and bytes moved (module 10)
    graphs        a decode step's kernels, eager against replayed steps, padding against capture sizes (module 11)
    piecewise     a mixed step's kernels eager against compiled, where a step's time goes, the engine (module 12)
"""
