"""Seeded workloads for the checkers, notebooks and benchmarks.

Prompts are text sampled from the model itself (temperature 1, top-k 50), so they read like the
training text without shipping it, differ with every seed, and come in any length asked for.
"""

import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt import EOS_TOKEN_ID

# The embedded models' held-out text: the last 10% of tiny-shakespeare (by GPT-2 tokens), which
# scripts/train.py never trains on. For perplexity (exercise 8) and tokenizer text (exercise 0).
HELDOUT_TEXT = Path(__file__).resolve().parents[1] / "data" / "shakespeare_heldout.txt"
NEWLINE = 198  # GPT-2's "\n": every prompt starts a new line, as a play's speeches do


@torch.no_grad()
def sample_prompts(model, n, min_len, max_len, seed):
    """n prompts (lists of token ids) with lengths drawn uniformly from [min_len, max_len]."""
    from solutions.ex2_kv_cache import KVCache, forward  # the reference, never the student's code

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator).tolist()
    ids = torch.full((n, 1), NEWLINE, device=model.device)
    kv_cache, rows = KVCache(model.config.n_layer), [ids]
    for step in range(max(lengths)):
        logits = forward(model, ids, torch.full_like(ids, step), kv_cache)[:, -1].float().cpu()
        logits[:, EOS_TOKEN_ID] = -float("inf")
        top = logits.topk(50)
        choice = torch.multinomial(top.values.softmax(-1), 1, generator=generator)
        ids = top.indices.gather(1, choice).to(model.device)
        rows.append(ids)
    tokens = torch.cat(rows, dim=1)[:, 1:].tolist()
    return [row[:length] for row, length in zip(tokens, lengths)]


def with_eos_inside(prompts, seed, eos_token_id=EOS_TOKEN_ID):
    """The prompts with the end-of-text token inside some of them, as real text has it (documents
    joined by <|endoftext|>; GPT-2 pads with the same id): every other prompt of 2+ tokens gets it at a
    random position before its last token. An EOS in the PROMPT must not stop generation, and a pad id
    in the prompt is a real token that must stay visible."""
    rng = random.Random(seed)
    out = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        if i % 2 == 0 and len(prompt) >= 2:
            prompt[rng.randrange(len(prompt) - 1)] = eos_token_id
        out.append(prompt)
    return out


# ----------------------------------------------------------------------------------------------
# Serving workloads (exercises 3 and 4, notebooks, benchmarks)

@dataclass
class Workload:
    """Requests for a serving engine, as plain lists (request i = prompts[i], max_new_tokens[i], ...)."""
    prompts: list  # lists of token ids
    max_new_tokens: list  # ints: the output length each request asks for
    arrival_times: list  # seconds after the start; all 0.0 when every request is there at once

    def __len__(self):
        return len(self.prompts)


def mixed_workload(model, n, prompt_len=(8, 64), output_len=(8, 64), rate=None, seed=0):
    """n requests with mixed prompt and output lengths, each drawn uniformly from its (min, max)
    range, with optional Poisson arrivals.

    rate: requests per second. None (or inf) puts every request there at time 0, the offline
    "throughput" setting; a finite rate spaces them by exponential gaps (a Poisson process), the
    online setting in which time to first token matters. The course's evaluation used rates of
    inf, 100 and 10 requests/s with 512-token inputs and 32-256 output tokens; the embedded tiny
    model has a context of 512 positions, so use shorter prompts with it.
    """
    if prompt_len[1] + output_len[1] > model.config.n_positions:
        raise ValueError(f"prompts up to {prompt_len[1]} tokens plus outputs up to {output_len[1]} exceed the model's context "
                         f"of {model.config.n_positions} positions: shorten one of the ranges.")
    rng = random.Random(seed)
    max_new_tokens = [rng.randint(*output_len) for _ in range(n)]
    arrival_times, now = [], 0.0
    for _ in range(n):
        arrival_times.append(now)
        if rate is not None and not math.isinf(rate):
            now += rng.expovariate(rate)
    return Workload(sample_prompts(model, n, *prompt_len, seed), max_new_tokens, arrival_times)
