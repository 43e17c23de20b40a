"""Seeded workloads for the checkers, notebooks and benchmarks.

Prompts are text sampled from the model itself (temperature 1, top-k 50), so they read like the
training text without shipping it, differ with every seed, and come in any length asked for.
"""

import torch

from gpt import EOS_TOKEN_ID

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
