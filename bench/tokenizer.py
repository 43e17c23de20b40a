"""Tokenizer benchmark: encoding throughput of exercise 0's GPT-2 tokenizer against the `tokenizers` library and
tiktoken, on the embedded models' held-out text, and exercise 0's trainer against the tokenizers library's.

    python bench/tokenizer.py                   # the reference solution, a few seconds
    python bench/tokenizer.py --impl exercises  # your own exercise 0
    python bench/tokenizer.py --save            # also write results/tokenizer.json (what the docs quote)

Encoding: the held-out text (workshop/data/shakespeare_heldout.txt) through each encoder, the encoders taking
turns over --repeats rounds after one untimed round; each row is the median round. Exercise 0's tokenizer is
timed three ways: new (its cache empty, as on a first text), warm (the same text again: every piece cached),
and without a cache. Every encoder's ids are compared with tiktoken's. One thread everywhere.

Training: train_byte_bpe on the first --train-chars characters of the held-out text up to --vocab-size
tokens, and the tokenizers library's BpeTrainer on the same (ByteLevel pre-tokenizer, GPT-2's byte alphabet):
the merges compared one by one, each trainer's time, and the merge at which 0a's tie rule (the pair met
first) would part from them.
"""

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the Rust libraries, on one thread like the rest
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import time

import torch

from workshop import tokenizers as bpe_tools
from workshop import results
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import HELDOUT_TEXT


def parse_args():
    p = argparse.ArgumentParser(description="Encoding throughput and training of exercise 0's BPE against the Rust libraries.")
    p.add_argument("--impl", choices=IMPLS, default=os.environ.get(IMPL_ENV, "solutions"),
                   help="whose exercise 0: the reference solutions/ (default) or your exercises/")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (the median is reported)")
    p.add_argument("--chars", type=int, default=None, help="encode only the first CHARS characters of the held-out text")
    p.add_argument("--train-chars", type=int, default=20_000, help="characters of held-out text to train on")
    p.add_argument("--vocab-size", type=int, default=556, help="vocabulary size to train to (256 byte tokens + merges)")
    p.add_argument("--save", action="store_true", help="write results/tokenizer.json")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    bpe = implementation("ex0_bpe", args.impl)
    text = HELDOUT_TEXT.read_text()[: args.chars]
    size = len(text.encode("utf-8"))
    encoding = bpe_tools.encoding_throughput(bpe, text, repeats=args.repeats)
    tokens = len(bpe_tools.tiktoken_gpt2().encode(text, allowed_special="all"))
    print(f"encoding the held-out text: {size:,} bytes, {tokens:,} GPT-2 tokens, median of {args.repeats} rounds ({args.impl}/)")
    print(f"{'encoder':<22}{'seconds':>10}{'MB/s':>9}{'tokens/s':>12}  same ids as tiktoken")
    for label, row in encoding.items():
        print(f"{label:<22}{row['seconds']:>10.4f}{row['mb_per_s']:>9.2f}{row['tokens_per_s']:>12,.0f}  {row['same_ids_as_tiktoken']}")
    ratios = {f"{label}_over_tiktoken": encoding[label]["seconds"] / encoding["tiktoken"]["seconds"] for label in encoding}

    train_text = HELDOUT_TEXT.read_text()[: args.train_chars]
    start = time.perf_counter()
    ours = bpe.train_byte_bpe(train_text, args.vocab_size)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs = bpe_tools.huggingface_merges(train_text, args.vocab_size)
    theirs_s = time.perf_counter() - start
    first_met = bpe_tools.first_met_merges(bpe, train_text, args.vocab_size)
    training = {"chars": len(train_text), "vocab_size": args.vocab_size, "merges": len(ours), "tokenizers_merges": len(theirs),
                "equal_merges": sum(tuple(a) == tuple(b) for a, b in zip(ours, theirs)),
                "first_difference": bpe_tools.first_divergence(ours, theirs),
                "first_met_parts_at": bpe_tools.first_divergence(first_met, theirs),
                "seconds": ours_s, "tokenizers_seconds": theirs_s, "first_merges": [" ".join(m) for m in ours[:10]]}
    print(f"\ntraining on {len(train_text):,} characters to {args.vocab_size} tokens: {len(ours)} merges in {ours_s:.2f} s, "
          f"the tokenizers library {len(theirs)} in {theirs_s:.3f} s; {training['equal_merges']} equal, first difference: "
          f"{training['first_difference']}; with 0a's rule (first met) the merges part at merge {training['first_met_parts_at']}")

    if args.save:
        path = results.save("tokenizer", {"text": {"path": str(HELDOUT_TEXT.relative_to(results.ROOT)), "bytes": size, "tokens": tokens,
                                                   "bytes_per_token": size / tokens},
                                          "encoding": encoding, "ratios": ratios, "training": training},
                            repeats=args.repeats, impl=args.impl)
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


if __name__ == "__main__":
    run_script(main)
