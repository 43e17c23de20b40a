"""Batch-1 decode against the memory-bandwidth limit: shared by bench/decode_bandwidth.py and scripts/gpu_check.py.

    copy_bandwidth(device)                    bytes read + written per second by a large device-to-device copy
    decode_bytes(model, prompt_len, new)      the bytes one decode step must read: every weight once, and the
                                              KV cache at the mean context length of the decode steps
    decode_step_time(ex2, model, ...)         seconds per decode step of exercise 2's `generate`, batch 1
    decode_against_bandwidth(ex2, model, ...) all three, and the step's share of the bandwidth limit

At batch 1 a decode step reads every weight to produce one token, so it can take no less than (bytes read) /
(memory bandwidth): the bandwidth limit. The share reported is that floor over the measured step time. The
bandwidth counts the bytes the copy reads plus the bytes it writes (memory moves both through the same
bus), and the step's bytes are those it reads (it writes little: one key and value per layer, the logits);
a share near 100% means the step is memory-bound, a few percent that something else (kernel launches,
Python) sets its pace. The KV bytes are a lower bound for exercise 2: its cache grows by torch.cat, which
also copies the whole cache every step.
"""

import statistics
import time

import torch

from workshop.grading.harness import paired_timing, synchronize


def copy_bandwidth(device, nbytes=None, repeats=10, copies=None):
    """Bytes read + written per second by copying one `nbytes` buffer into another on `device` (default 1 GiB
    on a GPU, 256 MiB on a CPU), `copies` times per sample (default 10 on a GPU, 1 on a CPU), synchronised;
    the median of `repeats` samples after a warm-up."""
    device = torch.device(device)
    gpu = device.type == "cuda"
    nbytes = nbytes or (2**30 if gpu else 2**28)
    copies = copies or (10 if gpu else 1)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(copies):
            dst.copy_(src)
        synchronize(device)
        samples.append((time.perf_counter() - start) / copies)
    del src, dst
    median = statistics.median(samples)
    return {"buffer_bytes": nbytes, "bytes_moved": 2 * nbytes, "counts": "read + written", "copies_per_sample": copies,
            "median_s": median, "samples_s": samples, "bytes_per_s": 2 * nbytes / median}


def decode_bytes(model, prompt_len, new_tokens):
    """The bytes a batch-1 decode step reads: every parameter once (GPT-2's tied wte / lm_head matrix once: it
    is the output layer) and the KV cache (keys and values of every layer) at the mean context length of the
    decode steps. generate(prompt, n) runs the prompt in one forward (the first token), then n - 1 decode
    steps, the j-th attending over prompt_len + j positions: a mean of prompt_len + n / 2."""
    config = model.config
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    element = params[0].element_size()
    kv_per_token = 2 * config.n_layer * config.n_embd * element
    mean_context = prompt_len + new_tokens / 2
    return {"weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token, "mean_context": mean_context,
            "kv_bytes": kv_per_token * mean_context, "bytes_per_step": weight_bytes + kv_per_token * mean_context,
            "element_bytes": element}


def decode_step_time(ex2, model, prompt_ids, new_tokens, repeats=5):
    """Seconds per decode step of ex2.generate at batch 1, the end-of-text token ignored: generate(prompt,
    new_tokens) and generate(prompt, 1) (the prefill alone) take turns over `repeats` rounds after a warm-up;
    a step is the median of the rounds' (full - prefill) / (new_tokens - 1). Also the time per generated token,
    prefill included (median full run / new_tokens), and every sample."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens is {new_tokens}: a decode step needs at least 2 new tokens (the first comes from the prefill).")
    device = model.device
    timing = paired_timing(lambda: ex2.generate(model, prompt_ids, new_tokens, eos_token_id=-1),
                           lambda: ex2.generate(model, prompt_ids, 1, eos_token_id=-1), repeats=repeats, device=device)
    steps = [(full - prefill) / (new_tokens - 1) for full, prefill in zip(timing.seconds_a, timing.seconds_b)]
    return {"step_s": statistics.median(steps), "step_samples_s": steps,
            "per_token_s": statistics.median(timing.seconds_a) / new_tokens, "generate_samples_s": timing.seconds_a,
            "prefill_samples_s": timing.seconds_b}


def decode_against_bandwidth(ex2, model, prompt_len=16, new_tokens=256, repeats=5, seed=0, copy_bytes=None, copy_repeats=10):
    """Copy bandwidth, bytes per decode step, the step time, and the step's share of the bandwidth limit
    (bytes per step / step time / bandwidth), for `model` at batch 1 on its device, a seeded random prompt."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    bandwidth = copy_bandwidth(model.device, copy_bytes, repeats=copy_repeats)
    need = decode_bytes(model, prompt_len, new_tokens)
    timed = decode_step_time(ex2, model, prompt, new_tokens, repeats)
    floor_s = need["bytes_per_step"] / bandwidth["bytes_per_s"]
    return {"prompt_len": prompt_len, "new_tokens": new_tokens, "bandwidth": bandwidth, "bytes": need, "time": timed,
            "floor_s": floor_s, "achieved_bytes_per_s": need["bytes_per_step"] / timed["step_s"],
            "share_of_bandwidth_limit": floor_s / timed["step_s"]}
