"""Attention kernels (module 10): bytes moved and time, for the prefill and the decode step.

    python bench/attention.py                 # the reference exercise 10, a minute or two on a CPU
    python bench/attention.py --impl exercises
    python bench/attention.py --save          # also write results/attention.json (what the deck and notebook quote);
                                              # on a machine with a GPU results/attention_<card>.json (e.g. _h200)

Bytes: what each path reads and writes in the GPU's slow memory (HBM) for one attention call of GPT-2
small's shape (12 heads of 64), counted by running the kernels through workshop.attention.HBM where that
is quick, and by the same formulas for the longer sequences (the script checks that the two agree):
standard attention writes and re-reads the T x T scores, FlashAttention reads K and V once per query
tile and never the scores. Decode: one query per sequence, whatever the kernel it must read the whole
cache; Flash-Decoding's split gives the GPU more pieces of work (one per chunk and head), not fewer bytes.

Time on the CPU: SDPA (torch's fused C++ kernel), the standard three-step path, exercise 10's
FlashAttention in plain PyTorch tiles, and for decode SDPA, Flash-Decoding and paged Flash-Decoding.
Each path's median over --repeats interleaved rounds, one torch thread. Plain PyTorch tiles are slower on
a CPU: every tile is several separate ops, each one a round trip through main memory and the Python
interpreter; the saving in bytes only turns into time when the tiles live in a fused kernel's on-chip
memory (a GPU's SRAM). On CUDA (when a GPU is present) the same kernels also run against SDPA's flash
and math backends; without one that section says so and is skipped.
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from workshop import attention as memory
from workshop import results
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script


def parse_args():
    p = argparse.ArgumentParser(description="Bytes moved and time of attention kernels: standard, FlashAttention, Flash-Decoding.")
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=IMPLS,
                   help=f"whose exercise 10 to run (default: ${IMPL_ENV}, else the reference solutions)")
    p.add_argument("--heads", type=int, default=12, help="heads (GPT-2 small: 12)")
    p.add_argument("--head-dim", type=int, default=64, help="dimension of a head (GPT-2: 64)")
    p.add_argument("--block", type=int, default=128, help="FlashAttention's query and key tile (default 128, FlashAttention-2's for a head of 64 on an A100)")
    p.add_argument("--byte-lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--counted-up-to", type=int, default=1024, help="count bytes by running the kernels up to this length")
    p.add_argument("--prefill-lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--decode-lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--chunk", type=int, default=256, help="Flash-Decoding's chunk (keys); paged: blocks of 16")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--save", action="store_true", help="write results/attention.json (the file the docs quote); with a GPU, "
                                                       "whose CUDA section runs, results/attention_<card>.json")
    return p.parse_args()


def median_times(paths, repeats, device="cpu"):
    """{name: median seconds}: every path once per round, the order alternating, after one warm-up each."""
    for fn in paths.values():
        fn()
    samples = {name: [] for name in paths}
    for r in range(repeats):
        for name in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            paths[name]()
            if device == "cuda":
                torch.cuda.synchronize()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def prefill_inputs(H, T, d, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(1, H, T, d, generator=g, device=device) for _ in range(3)]


def bytes_section(ex10, args):
    H, d, block = args.heads, args.head_dim, args.block
    rows = {}
    for T in args.byte_lengths:
        flash = memory.flash_attention_bytes(1, H, T, T, d, block, block, causal=True)
        standard = memory.standard_attention_bytes(1, H, T, T, d)
        row = {"standard_bytes": standard, "flash_bytes": flash, "flash_bytes_no_skipping": memory.flash_attention_bytes(1, H, T, T, d, block, block, causal=False),
               "standard_over_flash": standard / flash, "scores_bytes": 4 * H * T * T, "qkvo_bytes": 4 * 4 * H * T * d,
               "counted": T <= args.counted_up_to}
        row.update({key.replace("_bytes", "_mib"): row[key] / 2**20 for key in ("standard_bytes", "flash_bytes", "scores_bytes", "qkvo_bytes")})
        if row["counted"]:  # run both kernels through the counting memory model: the formulas must agree
            q, k, v = prefill_inputs(H, T, d)
            hbm, std = memory.HBM(q, k, v), memory.HBM(q, k, v)
            ex10.flash_attention(hbm, block, block)
            memory.standard_attention(std)
            if (hbm.bytes_moved, std.bytes_moved) != (flash, standard):
                raise ValueError(f"T={T}: counted {hbm.bytes_moved:,} / {std.bytes_moved:,} bytes, the formulas say {flash:,} / {standard:,}: "
                                 f"the kernel under test moves other bytes than FlashAttention's loop order (see exercise 10b).")
            row["max_error_vs_sdpa"] = (hbm.output - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item()
        rows[str(T)] = row
        print(f"bytes  T={T:>6}: standard {standard / 2**20:9.1f} MiB, FlashAttention {flash / 2**20:7.1f} MiB "
              f"({standard / flash:5.1f}x less){'  (counted)' if row['counted'] else ''}", flush=True)
    decode = {}
    for T in args.byte_lengths:
        decode[str(T)] = {"kv_bytes": 2 * 4 * H * T * d, "bytes": memory.decode_bytes(H, T, d),
                          "standard_bytes": memory.decode_bytes(H, T, d) + 2 * 4 * H * T,  # + the 1 x T scores written, read
                          "work_items_single": H, "work_items_split": H * -(-T // args.chunk)}
    return rows, decode


def cpu_times(ex10, args):
    H, d, block = args.heads, args.head_dim, args.block
    prefill = {}
    for T in args.prefill_lengths:
        q, k, v = prefill_inputs(H, T, d)
        times = median_times({
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "standard": lambda: memory.standard_attention(memory.HBM(q, k, v)),
            "flash_tiles": lambda: ex10.flash_attention(memory.HBM(q, k, v), block, block)}, args.repeats)
        prefill[str(T)] = {f"{name}_ms": 1e3 * s for name, s in times.items()}
        prefill[str(T)]["flash_over_sdpa"] = times["flash_tiles"] / times["sdpa"]
        prefill[str(T)]["standard_over_sdpa"] = times["standard"] / times["sdpa"]
        print(f"prefill T={T:>5}: " + ", ".join(f"{name} {1e3 * s:7.2f} ms" for name, s in times.items()), flush=True)
    decode = {}
    block_size = 16
    for T in args.decode_lengths:
        q, k, v = (t[:, :, -1:] if i == 0 else t for i, t in enumerate(prefill_inputs(H, T, d)))
        blocks = -(-T // block_size)
        perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(T)).tolist()
        pool_k = torch.zeros(blocks, block_size, H, d)
        pool_v = torch.zeros(blocks, block_size, H, d)
        for i, b in enumerate(perm):  # the sequence's blocks scattered over the pool
            pool_k[b, :min(block_size, T - i * block_size)] = k[0, :, i * block_size:(i + 1) * block_size].transpose(0, 1)
            pool_v[b, :min(block_size, T - i * block_size)] = v[0, :, i * block_size:(i + 1) * block_size].transpose(0, 1)
        times = median_times({
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
            "flash_decoding": lambda: ex10.flash_decoding(q, k, v, args.chunk),
            "paged_flash_decoding": lambda: ex10.paged_flash_decoding(q[0, :, 0], pool_k, pool_v, perm, T, args.chunk // block_size)},
            args.repeats)
        decode[str(T)] = {f"{name}_ms": 1e3 * s for name, s in times.items()}
        decode[str(T)]["chunks"] = -(-T // args.chunk)
        decode[str(T)]["flash_decoding_over_sdpa"] = times["flash_decoding"] / times["sdpa"]
        decode[str(T)]["kv_mib"] = 2 * 4 * H * T * d / 2**20
        print(f"decode  T={T:>5}: " + ", ".join(f"{name} {1e3 * s:7.3f} ms" for name, s in times.items()), flush=True)
    return prefill, decode


def cuda_times(ex10, args):
    if not torch.cuda.is_available():
        print("CUDA: no GPU here, section skipped", flush=True)
        return {"available": False, "reason": "no CUDA device on the machine that ran the benchmark"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, d, block = args.heads, args.head_dim, args.block
    out = {"available": True, "device": torch.cuda.get_device_name(), "dtype": "float16", "prefill": {}}
    for T in args.prefill_lengths + [2048, 4096]:
        q, k, v = (t.half() for t in prefill_inputs(H, T, d, device="cuda"))

        def backend(which):
            def run():
                with sdpa_kernel(which):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return run
        paths = {"sdpa_flash": backend(SDPBackend.FLASH_ATTENTION), "sdpa_math": backend(SDPBackend.MATH)}
        if T <= 1024:
            paths["flash_tiles"] = lambda: ex10.flash_attention(memory.HBM(q, k, v), block, block)
        times = median_times(paths, args.repeats, device="cuda")
        out["prefill"][str(T)] = {f"{name}_ms": 1e3 * s for name, s in times.items()}
        print(f"CUDA prefill T={T:>5}: " + ", ".join(f"{name} {1e3 * s:7.3f} ms" for name, s in times.items()), flush=True)
    return out


def main():
    args = parse_args()
    torch.set_num_threads(1)
    ex10 = implementation("ex10_attention", args.impl)
    byte_rows, decode_bytes = bytes_section(ex10, args)
    prefill, decode = cpu_times(ex10, args)
    data = {"impl": args.impl, "heads": args.heads, "head_dim": args.head_dim, "block": args.block, "chunk": args.chunk,
            "element_bytes": 4, "bytes": byte_rows, "decode_bytes": decode_bytes, "cpu_prefill": prefill, "cpu_decode": decode,
            "cuda": cuda_times(ex10, args)}
    longest = str(max(args.prefill_lengths))
    data["summary"] = {"longest_prefill": int(longest), "flash_over_sdpa_at_longest": prefill[longest]["flash_over_sdpa"],
                       "standard_over_sdpa_at_longest": prefill[longest]["standard_over_sdpa"],
                       "bytes_ratio_at_1024": byte_rows.get("1024", {}).get("standard_over_flash"),
                       "bytes_ratio_at_longest": byte_rows[str(max(args.byte_lengths))]["standard_over_flash"],
                       "longest_bytes": max(args.byte_lengths)}
    if args.save:
        # with its CUDA section the file is the GPU's (results/attention_<card>.json), the CPU's results/attention.json untouched
        path = results.save("attention", data, repeats=args.repeats, device="cuda" if data["cuda"]["available"] else "cpu")
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


if __name__ == "__main__":
    run_script(main)
