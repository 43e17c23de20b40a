"""int8 weight-only quantization of a gpt.py model, measured: memory, perplexity, greedy agreement,
the quantized matmul's error against torch.ao, and the outlier lesson.

    python bench/quantization.py                      # tiny model, CPU, the reference exercise 8: about two minutes
    python bench/quantization.py --impl exercises     # your own exercise 8
    python bench/quantization.py --save               # also write results/quantization.json (what the docs quote)

Variants of the model, each built by exercise 8's quantize_model:
  fp32              the model as loaded
  int8              every Linear of the blocks int8, per output channel (the tied embedding stays fp32)
  int8+embedding    the same, and the tied wte / lm_head matrix int8 too, stored once
  int8 per tensor   the blocks' Linears with ONE scale per matrix
  int8 groups of G  the blocks and the tied matrix with a scale per G consecutive weights of a row

Measured for each:
  bytes        of all the model's tensors, each storage once (workshop.quantization.tensor_bytes)
  perplexity   on the held-out text (workshop.serving.workloads.HELDOUT_TEXT, never trained on), windows of --window tokens
  agreement    --prompts seeded prompts, --new-tokens greedy tokens each with exercise 2's KV-cache generate:
               the share of the int8 model's tokens the fp32 model would pick after the same prefix, and
               the continuations identical token for token
  decode       exercise 2's generate of --new-tokens tokens, fp32 against int8 taking turns (median ratio)
Then the matmul error of every Linear (int8 weight-only per channel, and torch.ao's dynamic int8 Linear,
which quantizes the activations too, against fp32), and the outlier: one weight of h.0.mlp.c_fc set to
100x that matrix's largest, quantized per tensor and per channel.
"""

import argparse
import os
import statistics
import time

import torch

import gpt
import solutions.ex2_kv_cache as ex2
from workshop import results
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, paired_timing, run_script
from workshop.quantization import greedy_agreement, heldout_ids, matmul_errors, perplexity, tensor_bytes, with_outlier
from workshop.serving.workloads import sample_prompts


def parse_args():
    p = argparse.ArgumentParser(description="int8 weight-only quantization: memory, perplexity, greedy agreement, matmul error.")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help="whose exercise 8 quantizes: the reference solutions (default) or your exercises")
    p.add_argument("--window", type=int, default=512, help="tokens per perplexity window (at most the model's context)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="paired decode timings (the median ratio is reported)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write results/quantization.json (the file the docs quote)")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    ex8 = implementation("ex8_quantization", args.impl)
    model = gpt.load_model(args.model, device=args.device)
    tokenizer = gpt.load_tokenizer()
    ids = heldout_ids(tokenizer)
    window = min(args.window, model.config.n_positions)
    variants = {"fp32": model,
                "int8": ex8.quantize_model(model),
                "int8+embedding": ex8.quantize_model(model, include_embedding=True),
                "int8 per tensor": ex8.quantize_model(model, "tensor"),
                f"int8 groups of {args.group_size}": ex8.quantize_model(model, args.group_size, include_embedding=True)}
    prompts = sample_prompts(model, args.prompts, 4, 40, args.seed)
    fp32_bytes = tensor_bytes(model)
    linear_fp32 = sum(tensor_bytes(m) for m in model.transformer.h.modules() if isinstance(m, torch.nn.Linear))
    rows = {}
    for name, variant in variants.items():
        start = time.perf_counter()
        ppl = perplexity(variant, ids, window)
        row = {"bytes": tensor_bytes(variant), "size_ratio": fp32_bytes / tensor_bytes(variant), "perplexity": ppl}
        if name != "fp32":
            agreement = greedy_agreement(model, variant, prompts, args.new_tokens, ex2.generate)
            row["perplexity_change"] = ppl / rows["fp32"]["perplexity"] - 1
            row.update(agreement=agreement.agreement, identical=agreement.identical, tokens=agreement.tokens)
        rows[name] = row
        print(f"{name:<22} {row['bytes'] / 2**20:7.2f} MiB  {row['size_ratio']:4.2f}x smaller  perplexity {ppl:8.3f}"
              + (f" ({row['perplexity_change']:+.3%})  agreement {row['agreement']:.1%}, identical {row['identical']}/{len(prompts)}"
                 if name != "fp32" else "") + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    int8_linears = sum(tensor_bytes(m) for m in variants["int8"].transformer.h.modules() if isinstance(m, ex8.Int8Linear))

    decode = {}
    prompt = prompts[0]
    for name in ("int8", "int8+embedding"):
        timing = paired_timing(lambda quantized=variants[name]: ex2.generate(quantized, prompt, args.new_tokens, eos_token_id=-1),
                               lambda: ex2.generate(model, prompt, args.new_tokens, eos_token_id=-1),
                               repeats=args.repeats, device=args.device)
        decode[name] = {"int8_s": statistics.median(timing.seconds_a), "fp32_s": statistics.median(timing.seconds_b),
                        "slowdown": timing.ratio}
        print(f"decode, {name}: {timing.ratio:.2f}x the fp32 model's time ({args.new_tokens} tokens, median of {args.repeats} paired runs)")

    text_start = len(ids) // 2
    errors = matmul_errors(ex8, model, ids[text_start:text_start + 256])
    ours, ao = [e["int8_weight_only"] for e in errors.values()], [e["torch_ao_dynamic"] for e in errors.values()]
    print(f"matmul error, mean over {len(errors)} Linears: int8 weight-only {statistics.mean(ours):.2e}, "
          f"torch.ao dynamic int8 {statistics.mean(ao):.2e}")

    spiked, (row, col) = with_outlier(model, seed=args.seed)
    outlier = {"layer": "h.0.mlp.c_fc", "row": row, "col": col, "factor": 100.0, "perplexity": {"fp32": perplexity(spiked, ids, window)}}
    for granularity in ("tensor", "channel"):
        quantized = ex8.quantize_model(spiked, granularity)
        outlier["perplexity"][granularity] = perplexity(quantized, ids, window)
        q, _ = ex8.quantize(spiked.transformer.h[0].mlp.c_fc.weight.detach(), granularity)
        outlier[f"{granularity}_zero_share"] = (q == 0).float().mean().item()
    print(f"outlier at h.0.mlp.c_fc[{row}, {col}]: perplexity fp32 {outlier['perplexity']['fp32']:.2f}, int8 per tensor "
          f"{outlier['perplexity']['tensor']:.2f}, per channel {outlier['perplexity']['channel']:.2f}; "
          f"weights rounded to 0: {outlier['tensor_zero_share']:.0%} per tensor, {outlier['channel_zero_share']:.0%} per channel")

    data = {"model": args.model, "impl": args.impl, "heldout_tokens": len(ids), "window": window,
            "windows": len(range(0, len(ids) - window, window)), "prompts": len(prompts), "new_tokens": args.new_tokens,
            "group_size": args.group_size, "fp32_bytes": fp32_bytes,
            "linear_bytes": {"fp32": linear_fp32, "int8": int8_linears, "ratio": linear_fp32 / int8_linears},
            "variants": rows, "decode": decode,
            "matmul_error": {"layers": errors, "mean_int8_weight_only": statistics.mean(ours), "mean_torch_ao_dynamic": statistics.mean(ao),
                             "max_int8_weight_only": max(ours), "max_torch_ao_dynamic": max(ao)},
            "outlier": outlier}
    if args.save:
        path = results.save("quantization", data, repeats=args.repeats, device=args.device, wall_s=time.perf_counter() - started)
        print(f"wrote {path.relative_to(results.ROOT)}")


if __name__ == "__main__":
    run_script(main)
