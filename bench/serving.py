"""Serving benchmark: one seeded mixed workload through several engines, side by side, in one process.

    python bench/serving.py                                   # tiny model, CPU: about a minute
    python bench/serving.py --requests 64 --batch-size 16 --rate 20
    python bench/serving.py --model random-124M --device cuda --requests 256 --batch-size 32

Engines, all greedy on the same weights:
  hf-static      transformers' generate on left-padded batches of --batch-size, in order
  hf-continuous  transformers' generate_batch (its own continuous batching with a paged cache)
  static         exercise 3's reference (solutions/ex3_static_batching.py)
  continuous     exercise 4's reference (solutions/ex4_continuous_batching.py)

The end-of-sequence token is ignored (every request produces exactly its max_new_tokens), so the
engines do the same work; their outputs are compared request by request. --rate gives Poisson
arrivals to the continuous engine (static batching has no notion of arrival: it serves a full list).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import gpt
import solutions.ex3_static_batching as static
import solutions.ex4_continuous_batching as continuous
from workshop.harness import synchronize
from workshop.workloads import mixed_workload
from workshop.serving import ServingRun, run_continuous, run_static

NO_EOS = -1


def parse_args():
    p = argparse.ArgumentParser(description="Throughput and latency of static and continuous batching engines.")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--rate", type=float, default=None, help="requests per second for the continuous engine (default: all at once)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-hf", action="store_true", help="leave out the two transformers engines")
    return p.parse_args()


def run_hf_static(hf_model, workload, batch_size):
    """transformers' generate on left-padded batches: each batch runs until its longest request is done."""
    synchronize(hf_model.device)
    start, outputs, latency, steps = time.perf_counter(), [], [], 0
    for first in range(0, len(workload), batch_size):
        prompts = workload.prompts[first:first + batch_size]
        limits = workload.max_new_tokens[first:first + batch_size]
        input_ids, mask, _ = static.left_pad(prompts, device=hf_model.device)
        out = hf_model.generate(input_ids, attention_mask=mask.long(), max_new_tokens=max(limits), min_new_tokens=max(limits),
                                do_sample=False, pad_token_id=gpt.EOS_TOKEN_ID)
        synchronize(hf_model.device)
        outputs += [row[input_ids.shape[1]:input_ids.shape[1] + n] for row, n in zip(out.tolist(), limits)]
        latency += [time.perf_counter() - start] * len(prompts)
        steps += max(limits)
    tokens = sum(workload.max_new_tokens)
    occupancy = tokens / sum(max(workload.max_new_tokens[i:i + batch_size]) * len(workload.max_new_tokens[i:i + batch_size])
                             for i in range(0, len(workload), batch_size))
    return ServingRun("hf-static", batch_size, tokens, time.perf_counter() - start, occupancy, steps, latency), outputs


def run_hf_continuous(hf_model, workload, batch_size):
    """transformers' generate_batch: continuous batching over a paged KV cache."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max(workload.max_new_tokens), do_sample=False, eos_token_id=NO_EOS,
                              pad_token_id=gpt.EOS_TOKEN_ID, max_batch_tokens=batch_size * max(map(len, workload.prompts)))
    synchronize(hf_model.device)
    start = time.perf_counter()
    results = hf_model.generate_batch(inputs=workload.prompts, generation_config=config, progress_bar=False)
    seconds = time.perf_counter() - start
    # generate_batch takes one max_new_tokens for all: cut each answer to its own length
    outputs = [results[f"req_{i}"].generated_tokens[:n] for i, n in enumerate(workload.max_new_tokens)]
    return ServingRun("hf-continuous", batch_size, sum(workload.max_new_tokens), seconds, float("nan"), 0, []), outputs


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    model = gpt.load_model(args.model, device=args.device)
    workload = mixed_workload(model, args.requests, tuple(args.prompt_len), tuple(args.output_len), seed=args.seed)
    arrivals = mixed_workload(model, args.requests, tuple(args.prompt_len), tuple(args.output_len), rate=args.rate, seed=args.seed)
    print(f"{args.model} on {args.device}: {args.requests} requests, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, "
          f"outputs {args.output_len[0]}-{args.output_len[1]} tokens, batch size {args.batch_size}, "
          f"arrivals {'all at once' if args.rate is None else f'Poisson at {args.rate}/s'} (continuous engine)\n")

    static.generate_batch(model, workload.prompts[:2], 2, NO_EOS)  # warm-up
    runs, outputs = [], {}
    if not args.skip_hf:
        from transformers import GPT2LMHeadModel

        hf_model = GPT2LMHeadModel(model_config(model)).to(args.device).eval()
        missing, unexpected = hf_model.load_state_dict(gpt.hf_state_dict(model), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head is tied to wte
        hf_model.tie_weights()
        for run in (run_hf_static, run_hf_continuous):
            with torch.no_grad():
                result, got = run(hf_model, workload, args.batch_size)
            runs.append(result)
            outputs[result.label] = got
    ours_static = run_static(static, model, workload, args.batch_size, NO_EOS)
    ours_continuous = run_continuous(continuous, model, arrivals, args.batch_size, NO_EOS)
    runs += [ours_static, ours_continuous]

    print(f"{'engine':<15}{'tokens/s':>10}{'occupancy':>11}{'steps':>7}{'median latency':>16}{'median TTFT':>13}{'median TPOT':>13}")
    for r in runs:
        occupancy = f"{r.occupancy:>11.0%}" if r.occupancy == r.occupancy else f"{'-':>11}"
        print(f"{r.label:<15}{r.throughput:>10.0f}{occupancy}{r.steps or '-':>7}{median_ms(r.latency):>16}{median_ms(r.ttft)}{median_ms(r.tpot)}")
    # The workshop's engines are checked request by request against generation alone (pytest exercises/);
    # here transformers' engines are compared with the continuous one.
    reference = ours_continuous.result.outputs
    for label, got in outputs.items():
        same = sum(a == b for a, b in zip(got, reference))
        print(f"{label}: {same}/{len(reference)} outputs identical to the continuous engine's")


def median_ms(seconds):
    return f"{statistics.median(seconds) * 1e3:10.1f} ms" if seconds else f"{'-':>13}"


def model_config(model):
    from transformers import GPT2Config

    c = model.config
    return GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
                      layer_norm_epsilon=c.layer_norm_epsilon, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


if __name__ == "__main__":
    try:
        main()
    except (gpt.ModelLoadError, ValueError) as error:
        sys.exit(f"error: {error}")
