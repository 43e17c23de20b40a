"""Batch-1 decode against the memory-bandwidth limit: how close exercise 2's `generate` comes to reading
the weights at the speed the memory allows.

    python bench/decode_bandwidth.py                    # on a GPU: random-124M in float16; on a CPU: tiny in float32
    python bench/decode_bandwidth.py --save             # also write results/decode_bandwidth.json (on a GPU
                                                        # results/decode_bandwidth_<card>.json, e.g. _h200)
    python bench/decode_bandwidth.py --model random-124M --device cpu --new-tokens 64

Measured on the device at hand (workshop/bandwidth.py):
  bandwidth  a large device-to-device copy (--copy-mib), bytes read + written / time, median of --copy-repeats
  bytes      what one decode step reads: every weight once, and the KV cache at the mean context length
             of the decode steps (prompt + new tokens / 2)
  step       exercise 2's reference generate at batch 1, a --prompt-len token prompt, --new-tokens tokens with
             the end-of-text token ignored; (full run - prefill alone) / (new tokens - 1), median of --repeats
             paired rounds; also the time per generated token with the prefill
  share      bytes per step / step time / bandwidth: the bandwidth limit's floor over the step's time. The
             bandwidth counts read + written bytes, the step's bytes are its reads (it writes little).

On a GPU the small step is bound by kernel launches and Python, not memory: a share of a few percent (an H200,
float16: ../shared/gpu/h200-2026-11-26/). On a CPU, one thread, the share says how far the same is true there.
"""

import argparse

import torch

import gpt
from workshop import bandwidth
from workshop import results
from workshop.grading.harness import implementation, run_script


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Batch-1 decode per token against the measured memory bandwidth.")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--model", help="any name gpt.load_model takes (default: random-124M on a GPU, tiny on a CPU)")
    p.add_argument("--dtype", choices=gpt.DTYPES, help="default: float16 on a GPU, float32 on a CPU")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5, help="paired rounds of the full run and the prefill alone")
    p.add_argument("--copy-mib", type=int, help="the copied buffer in MiB (default: 1024 on a GPU, 256 on a CPU)")
    p.add_argument("--copy-repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the copy's too)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write results/decode_bandwidth.json (on a GPU decode_bandwidth_<card>.json)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    gpu = torch.device(args.device).type == "cuda"
    args.model = args.model or ("random-124M" if gpu else "tiny")
    args.dtype = args.dtype or ("float16" if gpu else "float32")
    ex2 = implementation("ex2_kv_cache", "solutions")
    model = gpt.load_model(args.model, device=args.device, dtype=gpt.DTYPES[args.dtype])
    where = f"{args.device} ({torch.cuda.get_device_name(torch.device(args.device))})" if gpu else f"{args.device}, {args.threads} thread(s)"
    print(f"{args.model} on {where}, {args.dtype}, batch 1: a {args.prompt_len}-token prompt, {args.new_tokens} new tokens "
          f"(end-of-text ignored), median of {args.repeats} paired rounds", flush=True)
    r = bandwidth.decode_against_bandwidth(ex2, model, args.prompt_len, args.new_tokens, args.repeats, args.seed,
                                           args.copy_mib and args.copy_mib * 2**20, args.copy_repeats)
    bw, need, timed = r["bandwidth"], r["bytes"], r["time"]
    print(f"copy bandwidth: {bw['bytes_per_s'] / 1e9:,.1f} GB/s, bytes read + written by a {bw['buffer_bytes'] / 2**20:,.0f} MiB "
          f"device-to-device copy (median of {len(bw['samples_s'])})")
    print(f"bytes read per decode step: {need['weight_bytes'] / 1e6:,.1f} MB of weights + {need['kv_bytes'] / 1e6:,.2f} MB of KV cache "
          f"at the mean context of {need['mean_context']:g} tokens = {need['bytes_per_step'] / 1e6:,.1f} MB")
    print(f"decode step: {timed['step_s'] * 1e3:.3f} ms (per generated token with the prefill: {timed['per_token_s'] * 1e3:.3f} ms); "
          f"rounds: {', '.join(f'{s * 1e3:.3f}' for s in timed['step_samples_s'])} ms")
    print(f"bandwidth limit: {r['floor_s'] * 1e3:.3f} ms a step; the step reads {r['achieved_bytes_per_s'] / 1e9:,.1f} GB/s: "
          f"{r['share_of_bandwidth_limit']:.1%} of the bandwidth limit (read bytes per step / step time / read + written copy bandwidth)")
    if args.save:
        data = {"model": args.model, "parameters": model.num_parameters(), "dtype": args.dtype, **r}
        path = results.save("decode_bandwidth", data, repeats=args.repeats, device=args.device, seed=args.seed,
                            bandwidth_counts="read + written")
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")
    return r


if __name__ == "__main__":
    run_script(main)
