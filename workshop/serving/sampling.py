"""The engines' sampler: given code, not an exercise's answer. Exercise 6 teaches the logits
processors one by one; the engines of exercises 4, 5 and 7 (and the server) sample with this module,
so that no stub depends on the reference of a later exercise.

One vectorised pass per step over the whole batch, as vLLM's sampler does: every parameter is a
per-row tensor (temperature, top-k, top-p, min-p, repetition penalty), greedy and sampled rows share
the batch, and a processor no row uses costs nothing. Each sampled row draws one uniform number with
its own seeded generator and inverts its own cumulative distribution, so a request's tokens depend on
its seed and its logits only: not on its place in the batch, nor on its neighbours. The inversion
works in two levels (blocks of BLOCK tokens, then inside one block), so that sampling costs about
what a softmax does: no cumulative sum over the whole vocabulary, nothing vocabulary-sized but the
scaled logits, which become the weights in place.
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


BLOCK = 256  # tokens per block of the two-level inverse CDF


def inverse_cdf(weights, u):
    """Per row of weights [B, V] (probabilities, not necessarily normalised, >= 0): the first token whose
    cumulative weight exceeds u[i] x the row's total (u [B] in [0, 1)), or -1 where rounding leaves
    none. In two levels, so that no cumulative sum runs over the whole vocabulary (a sequential scan,
    the slowest part of sampling on a CPU) and nothing vocabulary-sized is allocated: the blocks' sums,
    a cumulative sum over them, the block that holds the draw, then a cumulative sum inside that block
    only. Every operation is row by row: a row's token does not depend on the other rows."""
    rows, vocab = weights.shape
    full = vocab // BLOCK * BLOCK
    sums = weights[:, :full].reshape(rows, -1, BLOCK).sum(dim=2)  # [B, blocks]
    if full < vocab:
        sums = torch.cat([sums, weights[:, full:].sum(dim=1, keepdim=True)], dim=1)
    outer = sums.cumsum(dim=1)
    target = (u.view(-1, 1) * outer[:, -1:].double()).to(outer.dtype)
    block = torch.searchsorted(outer, target, right=True).clamp_(max=outer.shape[1] - 1)  # [B, 1]
    before = torch.where(block > 0, outer.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    index = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # [B, BLOCK]: the block's tokens
    inner = weights.gather(1, index.clamp(max=vocab - 1)).masked_fill(index >= vocab, 0).cumsum(dim=1)
    offset = torch.searchsorted(inner, (target - before).clamp(min=0), right=True)  # [B, 1]
    token = block * BLOCK + offset.clamp(max=BLOCK - 1)
    valid = (offset < BLOCK) & (token < vocab) & (weights.gather(1, token.clamp(max=vocab - 1)) > 0)
    return torch.where(valid, token, -1).view(-1)


def sample(logits, params, generators, histories=None):
    """The next token of each row of logits [B, V] (a list of B ints): row i by params[i] with
    generators[i] (a seeded CPU torch.Generator, unused by a greedy row). Greedy rows and sampled rows
    go through their processors apart (a greedy row needs only its argmax), each group in one pass."""
    if all(p.greedy and p.repetition_penalty == 1 for p in params):
        return logits.argmax(dim=1).tolist()
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    greedy = [i for i, p in enumerate(params) if p.greedy]
    tokens = [0] * len(params)

    def group(rows):  # the rows' logits, params and histories
        if len(rows) == len(params):
            return logits, params, histories
        index = torch.tensor(rows, device=logits.device)
        return logits[index], [params[i] for i in rows], None if histories is None else [histories[i] for i in rows]

    if greedy:
        some, their_params, their_histories = group(greedy)
        if any(p.repetition_penalty != 1 for p in their_params):
            some = filter_logits(some, their_params, their_histories)
        for i, token in zip(greedy, some.argmax(dim=1).tolist()):
            tokens[i] = token
    if sampled:
        some, their_params, their_histories = group(sampled)
        weights = filter_logits(some, their_params, their_histories)  # a new tensor (divided by the temperatures): ours to change
        weights = weights.sub_(weights.amax(dim=1, keepdim=True)).exp_()  # the softmax, unnormalised, in place
        # One uniform per row, from the row's own generator: the draw is the row's alone.
        u = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64) for i in sampled]).to(logits.device)
        picked = inverse_cdf(weights, u)
        missed = picked < 0
        if missed.any():  # rounding past the end: the mode
            picked = torch.where(missed, weights.argmax(dim=1), picked)
        for i, token in zip(sampled, picked.tolist()):
            tokens[i] = token
    return tokens
