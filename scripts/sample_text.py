"""Write text that a model generates: continuations of random windows of a text file, half greedy and
half sampled, served by exercise 5's reference engine. The embedded draft was distilled on such text
(what the target itself says is what a speculative draft must predict):

    python scripts/sample_text.py --model tiny --text ../shared/data/tinyshakespeare.txt --out target_text.txt
    python scripts/train.py --text target_text.txt --out models/tiny-draft --teacher tiny ...

Prompts come from the first 90% of the text only (train.py holds the last 10% out for validation).
"""

import argparse
import random

import torch

import gpt
from solutions.ex5_paged_kv_cache import Request, generate
from workshop.serving.sampling import GREEDY, SamplingParams


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--text", required=True, help="a UTF-8 text file whose windows are the prompts")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[4, 48], metavar=("MIN", "MAX"))
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0, help="of the sampled half")
    p.add_argument("--top-k", type=int, default=50, help="of the sampled half")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    model, tokenizer = gpt.load_model(args.model), gpt.load_tokenizer()
    tokens = tokenizer.encode(open(args.text, encoding="utf-8").read(), verbose=False)
    tokens = tokens[: int(0.9 * len(tokens))]
    requests = []
    for i in range(args.samples):
        length = rng.randint(*args.prompt_len)
        start = rng.randrange(len(tokens) - length)
        sampling = GREEDY if i % 2 == 0 else SamplingParams(temperature=args.temperature, top_k=args.top_k, seed=args.seed + i)
        requests.append(Request(tokens[start:start + length], args.new_tokens, sampling=sampling))
    result = generate(model, requests, args.batch_size)
    with open(args.out, "w", encoding="utf-8") as f:
        for request, output in zip(requests, result.outputs):
            f.write(tokenizer.decode(request.prompt_ids + output) + "\n\n")
    print(f"wrote {args.out}: {args.samples} samples, {result.stats.generated_tokens:,} generated tokens "
          f"in {result.stats.elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
