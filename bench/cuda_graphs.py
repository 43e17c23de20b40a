"""Static shapes and CUDA graphs for decode (module 11), measured on whatever device is present.

    python bench/cuda_graphs.py                     # tiny model, this device: about two minutes on a busy 2-core CPU
    python bench/cuda_graphs.py --save              # also write results/cuda_graphs.json (what the deck and notebook
                                                    # quote); on a GPU results/cuda_graphs_<card>.json (e.g. _h200)
    python bench/cuda_graphs.py --model random-124M --device cuda --save
    python bench/cuda_graphs.py --impl exercises    # your own exercise 11

Parts (the measuring code is workshop/replay.py):
  kernels   the ATen ops of one decode step at batch 1: exercise 5's forward, and exercise 11's decode_step (what
            a graph holds, traced by workshop.graphs.trace); views launch no kernel, the rest about one each.
            Whether trace accepts exercise 5's forward (it does not: its boolean index runs nonzero)
  steps     one decode step at each of --batch-sizes, sequences of --context tokens: exercise 5's forward, exercise
            11's DecodeGraphs eager (use_graphs=False), the static step a one-width graph holds run eagerly (padded
            batch, whole table), and DecodeGraphs replayed (use_graphs=True, the narrowest width that holds the step:
            real CUDA graphs on CUDA, workshop.graphs' CPU stand-in elsewhere; the file says which). Each path --steps
            calls per sample, --repeats rounds in a rotating order after a warm-up: medians, and the median per-round
            ratio to exercise 5 (> 1: faster)
  widths    at batch 1, sequences of --context tokens: the step replayed at the full table width (widths=[max_blocks])
            against its width bucket, taking turns as above: the widths, the keys a row attends to, the ATen ops of
            each (the same kernels, wider shapes), medians and the median per-round ratio (> 1: the bucket is faster)
  bandwidth at batch 1: the bytes a step reads (every weight, the KV cache at --context) over a device copy's
            bandwidth: the memory-bandwidth floor, and each path's share of it
  engine    --requests requests of the serving mix (prompts --prompt-len, outputs --output-len), all there at
            once, max batch --batch-size, the end-of-text ignored: exercise 5's engine against exercise 11's with
            cuda_graphs=False and True (on a CPU True is the stand-in; the engine's default there is off), taking
            turns over --engine-repeats rounds: output tokens/s, ratios, outputs identical to exercise 5's
  padding   rows computed per real row when decode batches are padded up to a capture size: powers of two,
            vLLM's steps of 8, every size, the largest only, and the best k sizes for each k, for batch sizes
            1..--batch-size each as likely and for the decode steps the engine really ran
"""

import argparse
import os
import time

import torch

import gpt
import solutions.ex5_paged_kv_cache as ex5
from workshop import bandwidth, replay, results
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import mixed_workload

PATHS = {"ex5": "exercise 5's forward", "eager": "DecodeGraphs, eager", "static": "the static step, eager",
         "replayed": "DecodeGraphs, replayed"}
BATCH1_TARGET = 3.0  # the issue's target on a GPU: batch-1 decode replayed at least 3x exercise 5's eager step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Eager against replayed decode steps, and exercise 5's engine with and without graphs.")
    p.add_argument("--device", default=gpt.default_device())
    p.add_argument("--model", default="tiny", help="any name gpt.load_model takes (tiny, random-124M, gpt2, ...)")
    p.add_argument("--dtype", choices=gpt.DTYPES, default="float32")
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help=f"whose exercise 11 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32],
                   help="decode steps timed at these batches (8: the CPU serving benchmark's, 32: the GPU run's)")
    p.add_argument("--context", type=int, default=64, help="tokens in each sequence of the timed steps")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=9, help="rounds of the timed steps")
    p.add_argument("--steps", type=int, default=5, help="decode steps per timed sample")
    p.add_argument("--requests", type=int, default=48, help="requests of the engine part (0: leave it out)")
    p.add_argument("--batch-size", type=int, default=32, help="the engines' max batch, and the padding part's largest size")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--engine-repeats", type=int, default=5, help="rounds of the engine part")
    p.add_argument("--copy-mib", type=int, help="the copied buffer of the bandwidth part in MiB (default: 1024 on a GPU, 256 on a CPU)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true", help="a progress bar over the engine rounds")
    p.add_argument("--save", action="store_true", help="write results/cuda_graphs.json (on a GPU cuda_graphs_<card>.json)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]  # the load says how busy the machine was
    torch.set_num_threads(args.threads)
    ex11 = implementation("ex11_cuda_graphs", args.impl)
    model = gpt.load_model(args.model, device=args.device, dtype=gpt.DTYPES[args.dtype])
    gpu = model.device.type == "cuda"
    where, kind = replay.describe_device(model.device)
    largest = max(args.batch_sizes)
    print(f"{args.model} ({model.num_parameters():,} parameters, {args.dtype}) on {where}; exercise 11 from {args.impl}/; "
          f"replayed = {kind}", flush=True)

    case = replay.DecodeCase(ex5, ex11, model, largest, args.context, args.block_size, args.seed)
    print(f"captured {len(case.replayed.graphs)} graphs (sizes {case.replayed.sizes} by widths {case.replayed.widths} blocks) in "
          f"{case.capture_s:.2f} s", flush=True)

    kernels = replay.kernels_per_step(case, 1)
    e, s = kernels["ex5_forward"], kernels["decode_step"]
    print(f"\nkernels, one decode step at batch 1 ({kernels['layers']} layers): exercise 5's forward {e['aten_ops']} ATen ops "
          f"({e['kernels']} not views), decode_step {s['aten_ops']} ({s['kernels']} not views; trace: {kernels['decode_step_traced']}); "
          f"fill {kernels['fill']['aten_ops']}")
    print(f"  trace of exercise 5's forward: {'accepted' if kernels['ex5_forward_capturable'] else 'refused: ' + kernels['ex5_forward_refused'][:100]}")

    steps = {}
    print(f"\ndecode steps, sequences of {args.context} tokens, median of {args.repeats} rounds of {args.steps} steps:")
    for n in args.batch_sizes:
        paths = case.paths(n)
        differences = replay.max_difference(paths)
        timed = replay.time_paths(paths, args.repeats, args.steps, device=model.device)
        steps[str(n)] = {name: {"ms": t["step_s"] * 1e3, "over_ex5": t["over_first"], "samples_ms": [x * 1e3 for x in t["samples_s"]],
                                "max_difference": differences[name]} for name, t in timed.items()}
        steps[str(n)]["padded_to"] = ex11.padded_size(n, case.eager.sizes)
        print(f"  batch {n:>3}: " + ", ".join(f"{name} {t['step_s'] * 1e3:7.3f} ms ({t['over_first']:.2f}x)" for name, t in timed.items())
              + f"; largest difference from exercise 5 {max(differences.values()):.1e}", flush=True)

    widths = replay.width_buckets(case, 1, args.repeats, args.steps)
    full, bucket = widths["full"], widths["bucket"]
    print(f"\nwidths, batch 1, sequences of {args.context} tokens (capture widths {widths['widths']} blocks of {args.block_size}): "
          f"full width {full['width']} blocks ({full['keys_per_row']} keys a row) {full['ms']:.3f} ms, its bucket {bucket['width']} "
          f"({bucket['keys_per_row']} keys) {bucket['ms']:.3f} ms: {widths['bucket_over_full']:.2f}x; ATen ops per step "
          f"{full['ops']['aten_ops']} and {bucket['ops']['aten_ops']}", flush=True)

    copy = bandwidth.copy_bandwidth(model.device, args.copy_mib and args.copy_mib * 2**20, repeats=5)
    need = bandwidth.decode_bytes(model, args.context, 0)  # batch 1, a context of --context tokens
    floor_s = need["bytes_per_step"] / copy["bytes_per_s"]
    share = {name: floor_s / (path["ms"] / 1e3) for name, path in steps["1"].items() if isinstance(path, dict)} if "1" in steps else {}
    memory = {"copy": copy, "bytes": need, "floor_ms": floor_s * 1e3, "share_of_bandwidth_limit": share,
              "copy_gb_per_s": copy["bytes_per_s"] / 1e9, "mb_per_step": need["bytes_per_step"] / 1e6}
    print(f"\nbandwidth: {copy['bytes_per_s'] / 1e9:,.1f} GB/s (copy, read + written); a batch-1 step reads {need['bytes_per_step'] / 1e6:,.1f} MB: "
          f"floor {floor_s * 1e3:.3f} ms; " + ", ".join(f"{name} {v:.1%}" for name, v in share.items()))

    engine, workload_record, measured = None, None, None
    if args.requests:
        workload = mixed_workload(model, args.requests, tuple(args.prompt_len), tuple(args.output_len), seed=args.seed)
        workload_record = {"requests": args.requests, "prompt_len": args.prompt_len, "output_len": args.output_len,
                           "tokens": sum(workload.max_new_tokens), "batch_size": args.batch_size, "seed": args.seed}
        print(f"\nengine: {args.requests} requests ({workload_record['tokens']} output tokens), max batch {args.batch_size}, "
              f"{args.engine_repeats} rounds", flush=True)
        engine = replay.engine_runs(ex5, ex11, model, workload, args.batch_size, args.engine_repeats, args.block_size, args.progress)
        engine["default_graphs"] = gpu  # cuda_graphs=None: on CUDA only
        measured = engine["decode_batch_sizes"]
        for label, r in engine["engines"].items():
            print(f"  {label:<11} {r['tokens_per_s']:8,.0f} tokens/s ({r['over_ex5']:.2f}x exercise 5), {r['steps']} steps, "
                  f"{r['outputs_identical']}/{r['requests']} outputs identical to exercise 5's")

    pad = replay.padding(args.batch_size, ex11.capture_sizes, measured)
    print(f"\npadding, batch sizes 1..{args.batch_size}" + (" (uniform; measured: the engine's decode steps)" if measured else "") + ":")
    for name, row in pad["lists"].items():
        print(f"  {row['label']:<20} {row['graphs']:>3} graphs: {row['uniform']:.3f} rows per real row"
              + (f" (measured {row['measured']:.3f})" if measured else ""))

    ratio = steps.get("1", {}).get("replayed", {}).get("over_ex5")
    data = {"model": args.model, "parameters": model.num_parameters(), "dtype": args.dtype, "impl": args.impl,
            "device": model.device.type, "replayed_with": kind, "graphs_are_cuda": gpu, "context": args.context,
            "n_positions": model.config.n_positions, "max_blocks": case.max_blocks,
            "block_size": args.block_size, "capture_sizes": case.replayed.sizes, "capture_widths": case.replayed.widths, "capture_s": case.capture_s,
            "capture_reserved_bytes": case.capture_reserved_bytes,
            "paths": PATHS, "kernels": kernels, "steps": steps, "bandwidth": memory, "workload": workload_record,
            "widths": widths, "engine": engine, "padding": pad,
            "targets": {"batch1_replayed_over_ex5": {"ratio": ratio, "target": BATCH1_TARGET, "applies": gpu,
                                                     "met": (ratio >= BATCH1_TARGET) if gpu and ratio is not None else None,
                                                     "note": "a GPU's target (launch overhead); a CPU has none to remove"}}}
    if args.save:
        path = results.save(results.with_dtype("cuda_graphs", args.dtype), data, repeats=args.repeats, device=args.device, seed=args.seed, steps_per_sample=args.steps,
                            engine_repeats=args.engine_repeats, wall_s=time.perf_counter() - started,
                            load_average=[load_at_start, os.getloadavg()[0]])
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")
    return data


if __name__ == "__main__":
    run_script(main)
