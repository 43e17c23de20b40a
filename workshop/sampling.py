"""The engines' sampler: given code, not an exercise's answer. Exercise 6 teaches the logits
processors one by one; the engines of exercises 4, 5 and 7 (and the server) sample with this module,
so that no stub depends on the reference of a later exercise.

One vectorised pass per step over the whole batch, as vLLM's sampler does: every parameter is a
per-row tensor (temperature, top-k, top-p, min-p, repetition penalty), greedy and sampled rows share
the batch, and a processor no row uses costs nothing. Each sampled row draws one uniform number with
its own seeded generator and inverts its own cumulative distribution, so a request's tokens depend on
its seed and its logits only: not on its place in the batch, nor on its neighbours.
"""

from dataclasses import dataclass

import torch

FILTERED = -float("inf")  # the logit of a removed token: probability exactly 0


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens (vLLM's and OpenAI's names). temperature 0 is greedy;
    top_k 0, top_p 1, min_p 0 and repetition_penalty 1 switch those processors off; seed None draws
    a fresh seed. Bad values are refused here, before any work."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = None

    def __post_init__(self):
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature is {self.temperature}: use 0 for greedy decoding or a positive value to sample.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k is {self.top_k}: use a whole number >= 1 to keep that many tokens, or 0 to switch top-k off.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p is {self.top_p}: it must be in (0, 1]; 1 switches top-p off.")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p is {self.min_p}: it must be in [0, 1]; 0 switches min-p off.")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty is {self.repetition_penalty}: it must be positive; 1 switches it off.")
        if self.seed is not None and not (isinstance(self.seed, int) and -2**63 <= self.seed < 2**64):
            raise ValueError(f"seed is {self.seed}: use a whole number between -2**63 and 2**64 - 1, or none for a fresh one.")

    @property
    def greedy(self):
        return self.temperature == 0


GREEDY = SamplingParams(temperature=0.0)


def make_generator(seed):
    """A CPU generator: seeded when seed is not None, else with a fresh nondeterministic seed."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed % 2**64)  # torch takes [0, 2**64); a negative seed wraps as in numpy's uint64
    return generator


def _column(values, logits, dtype=None):
    return torch.tensor(values, dtype=dtype or logits.dtype, device=logits.device).view(-1, 1)


def penalize_repetitions(logits, histories, penalties):
    """CTRL's repetition penalty, every row at once: a token already in the row's history (prompt and
    output) has a positive logit divided by the penalty, a negative one multiplied by it."""
    width = max(map(len, histories), default=0)
    if width == 0:
        return logits
    vocab = logits.shape[1]
    ids = torch.tensor([list(h) + [vocab] * (width - len(h)) for h in histories], dtype=torch.long, device=logits.device)
    seen = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device).scatter_(1, ids, True)[:, :vocab]
    penalty = _column(penalties, logits)
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def filter_logits(logits, params, histories=None):
    """logits [B, V] after each row's processors (repetition penalty, temperature, top-k, top-p, min-p,
    in transformers' order); greedy rows keep only their argmax. Ties with the last token a rule keeps
    are kept. histories: each row's token ids so far, needed when a row sets a repetition penalty."""
    logits = logits.float()
    if any(p.repetition_penalty != 1 for p in params):
        if histories is None:
            raise ValueError("a repetition penalty needs each row's history (prompt and output token ids).")
        logits = penalize_repetitions(logits, histories, [p.repetition_penalty for p in params])
    greedy = _column([p.greedy for p in params], logits, torch.bool)
    if greedy.any():
        best = logits.max(dim=1, keepdim=True)
        argmax_only = torch.full_like(logits, FILTERED).scatter(1, best.indices, best.values)
    logits = logits / _column([p.temperature or 1.0 for p in params], logits)
    vocab = logits.shape[1]
    if any(0 < p.top_k < vocab for p in params):
        k = _column([p.top_k if 0 < p.top_k < vocab else vocab for p in params], logits, torch.long)
        kth = logits.topk(int(k.max()), dim=1).values.gather(1, k - 1)
        logits = logits.masked_fill(logits < kth, FILTERED)
    if any(p.top_p < 1 for p in params):  # drop the least likely tokens while together they weigh at most 1 - p
        ascending = logits.sort(dim=1).values
        tail = ascending.softmax(dim=1).cumsum(dim=1)
        dropped = tail <= torch.tensor([[1 - p.top_p] for p in params], dtype=torch.float64, device=logits.device)
        dropped[:, -1] = False  # the most likely token always stays
        lowest_kept = ascending.masked_fill(dropped, float("inf")).min(dim=1, keepdim=True).values
        logits = logits.masked_fill(logits < lowest_kept, FILTERED)
    if any(p.min_p > 0 for p in params):
        probs = logits.softmax(dim=1)
        logits = logits.masked_fill(probs < _column([p.min_p for p in params], logits) * probs.max(dim=1, keepdim=True).values, FILTERED)
    return torch.where(greedy, argmax_only, logits) if greedy.any() else logits


def sample(logits, params, generators, histories=None):
    """The next token of each row of logits [B, V] (a list of B ints): row i by params[i] with
    generators[i] (a seeded CPU torch.Generator, unused by a greedy row)."""
    if all(p.greedy and p.repetition_penalty == 1 for p in params):
        return logits.argmax(dim=1).tolist()
    logits = filter_logits(logits, params, histories)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    tokens = logits.argmax(dim=1)
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        cdf = logits[rows].softmax(dim=1).cumsum(dim=1)
        # One uniform per row, from the row's own generator: the draw is the row's alone.
        u = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64) for i in sampled]).to(logits.device)
        picked = torch.searchsorted(cdf, (u.view(-1, 1) * cdf[:, -1:]).to(cdf.dtype), right=True).view(-1)
        picked = torch.where(picked < cdf.shape[1], picked, tokens[rows])  # rounding past the end: the mode
        tokens[rows] = picked
    return tokens.tolist()
