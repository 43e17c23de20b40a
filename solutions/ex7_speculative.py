"""Exercise 7: speculative decoding.

A decode step reads every weight of the model to produce one token: it is bound by moving weights,
not by arithmetic. So a small *draft* model proposes k tokens (k cheap steps), and the large
*target* scores all k + 1 positions in ONE forward, about the price of a single step. The target
keeps the longest prefix it agrees with and adds one token of its own, so every round yields between
1 and k + 1 tokens for one target forward.

Nothing about the output changes: greedy verification gives exactly the target's greedy tokens, and
rejection sampling gives exactly the target's sampling distribution (Leviathan et al. 2023, Chen et
al. 2023). Only the speed depends on the draft: on how often it agrees (alpha) and what it costs.

Parts: 7a drafting, 7b verification (greedy), 7c rejection sampling, 7d rolling a cache back,
7e the decoding loop and its statistics, 7f (stretch) Jacobi decoding with the target alone.
Exercise 2's KV cache is used through its reference; sampling (SamplingParams, filter_logits) comes
from workshop/serving/sampling.py, given code that is not exercise 6's answer.
"""

import copy
from dataclasses import dataclass

import torch

from gpt import EOS_TOKEN_ID, check_request, check_token_ids
from solutions.ex2_kv_cache import KVCache, forward
from workshop.serving.sampling import GREEDY, SamplingParams, filter_logits, make_generator  # noqa: F401 (given code, not exercise 6's answer)


def extend(model, cache, token_ids):
    """Run token_ids (a list) through model at the positions after those already in cache (an
    exercise 2 KVCache, which they are appended to); return their logits [len(token_ids), vocab]."""
    start = len(cache)
    ids = torch.tensor([token_ids], device=model.device)
    positions = torch.arange(start, start + len(token_ids), device=model.device)[None]
    return forward(model, ids, positions, cache)[0]


def probabilities(logits, sampling, histories):
    """Each row's sampling distribution [T, vocab] on the CPU: the processors of workshop/serving/sampling.py, then softmax.
    histories[i]: the tokens before row i (for the repetition penalty). Greedy gives one-hot rows."""
    return filter_logits(logits, [sampling] * len(logits), histories).softmax(dim=-1).cpu()


class ShortlistHead(torch.nn.Module):
    """An output layer that scores only `token_ids` and gives every other token -inf (probability 0).
    A small draft spends most of a step reading its vocab x n_embd output matrix; the few thousand
    tokens its target really writes keep nearly all of its agreement for a fraction of the price
    (FR-Spec, Zhao et al. 2025). Whatever the draft's distribution, the output stays exact: only
    alpha can change."""

    def __init__(self, weight, token_ids):
        super().__init__()
        self.vocab_size = weight.shape[0]
        self.register_buffer("token_ids", torch.as_tensor(token_ids, device=weight.device))
        self.register_buffer("weight", weight.detach()[self.token_ids].clone())

    def forward(self, x):
        logits = x.new_full((*x.shape[:-1], self.vocab_size), float("-inf"))
        logits[..., self.token_ids] = x @ self.weight.T
        return logits


def shortlist(model, token_ids):
    """A copy of a gpt.py model whose output layer scores only token_ids (see ShortlistHead)."""
    model = copy.deepcopy(model)
    model.lm_head = ShortlistHead(model.lm_head.weight, token_ids)
    return model


# ----------------------------------------------------------------------------------------------
# 7d: rolling a cache back

def rollback(cache, length):
    """Keep the first `length` positions of every layer of cache (an exercise 2 KVCache), forget the rest."""
    if not 0 <= length <= len(cache):
        raise ValueError(f"cannot roll a cache of {len(cache)} positions back to {length}: keep between 0 and {len(cache)}.")
    for layer, (keys, values) in enumerate(zip(cache.keys, cache.values)):
        if keys is not None:  # an empty cache has nothing to forget
            cache.keys[layer], cache.values[layer] = keys[:, :, :length], values[:, :, :length]


# ----------------------------------------------------------------------------------------------
# 7a: drafting

class DraftModel:
    """The draft: a small gpt.py model with its own KV cache, kept in step with the accepted text of
    one sequence (each call's context extends the last call's)."""

    def __init__(self, model):
        self.model = model
        self.cache = KVCache(model.config.n_layer)
        self.forwards = 0

    @torch.no_grad()
    def propose(self, context, k, sampling=GREEDY, generator=None):
        """Draft k tokens to follow context (the accepted tokens), one forward each, each drawn from the
        draft's own distribution. Returns (tokens, probs): probs [k, vocab] holds, row i, the
        distribution q that token i was drawn from (one-hot when greedy)."""
        check_token_ids(context, self.model.config.vocab_size, "context token")  # given: on the host, before any kernel
        # Each context extends the last one by the drafts the target accepted and one token of its own,
        # so the cache is right up to the first rejected draft: roll back to there, but never past
        # context's last token, whose logits give the first draft token.
        rollback(self.cache, min(len(self.cache), len(context) - 1))
        feed, tokens, probs = list(context[len(self.cache):]), [], []
        argmax_only = sampling.greedy and sampling.repetition_penalty == 1  # q is one-hot on the argmax: skip the processors
        for _ in range(k):
            logits = extend(self.model, self.cache, feed)[-1:]
            self.forwards += 1
            if argmax_only:
                token = logits.max(dim=-1).indices.item()  # the argmax: max(dim) finds it faster than argmax() on a CPU
            else:
                q = probabilities(logits, sampling, [list(context) + tokens])[0]
                token = q.argmax().item() if sampling.greedy else torch.multinomial(q, 1, generator=generator).item()
                probs.append(q)
            tokens.append(token)
            feed = [token]
        if argmax_only:  # one-hot rows, made in one go
            return tokens, torch.zeros(k, self.model.config.vocab_size).scatter_(1, torch.tensor(tokens, dtype=torch.long)[:, None], 1.0)
        return tokens, torch.stack(probs) if probs else torch.empty(0, self.model.config.vocab_size)


# ----------------------------------------------------------------------------------------------
# 7b: verification, greedy

def verify(model, cache, context, draft_tokens):
    """ONE forward of the target over the tokens of context not yet in its cache (at least the last
    one) followed by the k draft tokens. Returns logits [k + 1, vocab]: row i is the target's
    next-token logits after context + draft_tokens[:i]. The k + 1 queries come after the cached
    keys, so the causal mask is lower-right aligned (exercise 2's forward builds it so)."""
    check_token_ids(list(context) + list(draft_tokens), model.config.vocab_size, "context + draft token")  # given: on the host
    logits = extend(model, cache, list(context[len(cache):]) + list(draft_tokens))
    return logits[-(len(draft_tokens) + 1):]


def accept_greedy(draft_tokens, target_logits):
    """The longest prefix of draft_tokens that equals the target's argmax, then the target's own next
    token: a correction at the first disagreement, or a bonus token when all k agree (1 to k + 1 tokens)."""
    best = target_logits.max(dim=-1).indices.tolist()  # each row's argmax (faster than argmax() on a CPU)
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == best[n]:
        n += 1
    return list(draft_tokens[:n]) + [best[n]]


# ----------------------------------------------------------------------------------------------
# 7c: verification, rejection sampling

def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    """Rejection sampling. Draft token i (drawn from q = draft_probs[i]) is accepted with probability
    min(1, p / q), p = target_probs[i]. At the first rejection, one token is drawn from
    normalize(max(p - q, 0)) and the round ends; when all k are accepted, a bonus token is drawn from
    target_probs[k]. Each emitted token is then distributed exactly as the target's p."""
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if torch.rand(1, generator=generator).item() * q[token] < p[token]:  # u < p/q: accepted
            continue
        residual = (p - q).clamp(min=0)  # where the target wants more than the draft offered
        if residual.sum() <= 0:  # p == q up to rounding: then p itself is the residual
            residual = p
        return list(draft_tokens[:i]) + [torch.multinomial(residual, 1, generator=generator).item()]
    return list(draft_tokens) + [torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()]


# ----------------------------------------------------------------------------------------------
# 7e: the decoding loop, and what it costs

@dataclass
class SpeculativeStats:
    target_forwards: int = 0  # one per round (the first round also runs the prompt)
    draft_forwards: int = 0
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the target accepted
    generated: int = 0  # tokens returned

    @property
    def acceptance_rate(self):
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_forward(self):
        return self.generated / self.target_forwards if self.target_forwards else 0.0


class SpeculativeDecoder:
    """Speculative decoding of one prompt, a round at a time. `draft` is a gpt.py model (wrapped in a
    DraftModel) or any object with DraftModel's propose() and a `forwards` count (its propose() may
    return fewer tokens than asked, e.g. none after its own EOS). After each round,
    `tokens` holds the prompt and every accepted token, and the target's cache exactly tokens[:-1]."""

    def __init__(self, target, draft, prompt_ids, k=4, sampling=GREEDY, eos_token_id=EOS_TOKEN_ID):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k is {k!r}: the draft must propose at least 1 token per round.")
        config = getattr(draft, "config", None) or getattr(getattr(draft, "model", None), "config", None)  # a model or a DraftModel
        draft_vocab = getattr(config, "vocab_size", target.config.vocab_size)
        if draft_vocab != target.config.vocab_size:  # its tokens would index past the target's embedding (or miss ids)
            raise ValueError(f"The draft's vocabulary has {draft_vocab} ids and the target's {target.config.vocab_size}: "
                             f"pair models that share a tokenizer.")
        check_token_ids(prompt_ids, target.config.vocab_size)
        self.target, self.k, self.sampling, self.eos_token_id = target, k, sampling, eos_token_id
        self.draft = draft if hasattr(draft, "propose") else DraftModel(draft)
        self.cache = KVCache(target.config.n_layer)
        self.tokens = list(prompt_ids)
        self.generator = make_generator(sampling.seed)
        self.stats = SpeculativeStats()
        self.finished = False

    @torch.no_grad()
    def step(self, max_tokens):
        """One round: draft, verify, accept, roll back. Returns the new tokens (1 to min(k + 1, max_tokens)),
        cut after EOS, which finishes the decoder."""
        k = min(self.k, max_tokens - 1)  # never draft what could not be returned
        drafted, draft_probs = self.draft.propose(self.tokens, k, self.sampling, self.generator) if k else ([], None)
        logits = verify(self.target, self.cache, self.tokens, drafted)
        if self.sampling.greedy and self.sampling.repetition_penalty == 1:
            emitted = accept_greedy(drafted, logits)
        else:
            target_probs = probabilities(logits, self.sampling, [self.tokens + drafted[:i] for i in range(len(drafted) + 1)])
            emitted = accept_sampled(drafted, draft_probs, target_probs, self.generator)
        rollback(self.cache, len(self.tokens) + len(emitted) - 1)  # drop the rejected drafts' keys and values
        accepted = len(emitted) - 1
        if self.eos_token_id in emitted:
            emitted = emitted[: emitted.index(self.eos_token_id) + 1]
            self.finished = True
        self.tokens += emitted
        self.stats.target_forwards += 1
        self.stats.draft_forwards = self.draft.forwards
        self.stats.drafted += len(drafted)
        self.stats.accepted += accepted
        self.stats.generated += len(emitted)
        return emitted


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, sampling=GREEDY, eos_token_id=EOS_TOKEN_ID):
    """Speculative decoding: the same tokens as exercise 2's greedy generate (greedy sampling) or the
    same distribution as sampling from the target (any other SamplingParams). Returns (new tokens, stats)."""
    check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    decoder = SpeculativeDecoder(target, draft, prompt_ids, k, sampling, eos_token_id)
    new_tokens = []
    while len(new_tokens) < max_new_tokens and not decoder.finished:
        new_tokens += decoder.step(max_new_tokens - len(new_tokens))
    return new_tokens, decoder.stats


# ----------------------------------------------------------------------------------------------
# 7f (stretch): Jacobi decoding, the target as its own draft

@torch.no_grad()
def jacobi_generate(target, prompt_ids, max_new_tokens, n=4, eos_token_id=EOS_TOKEN_ID):
    """Greedy decoding by Jacobi iteration: guess the next n tokens, verify them in one forward as in
    7b, keep the agreeing prefix and the target's next token, and take the target's predictions at
    the positions after it as the next guesses (a fixed-point iteration on the whole window). The
    output is exactly greedy, up to max_new_tokens or the EOS; each forward yields at least one token.
    Returns (new tokens, stats)."""
    check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    cache, tokens, new_tokens, stats = KVCache(target.config.n_layer), list(prompt_ids), [], SpeculativeStats()
    guesses = [tokens[-1]] * n  # any start works; the iteration repairs it
    while len(new_tokens) < max_new_tokens:
        guesses = guesses[: min(n, max_new_tokens - len(new_tokens) - 1)]
        logits = verify(target, cache, tokens, guesses)
        emitted = accept_greedy(guesses, logits)
        rollback(cache, len(tokens) + len(emitted) - 1)
        predictions = logits.max(dim=-1).indices.tolist()[len(emitted):]  # made after a wrong guess: next iterate
        guesses = predictions + [emitted[-1]] * (n - len(predictions))
        stats.target_forwards += 1
        stats.drafted += len(logits) - 1
        stats.accepted += len(emitted) - 1
        if eos_token_id in emitted:
            emitted = emitted[: emitted.index(eos_token_id) + 1]
        tokens += emitted
        new_tokens += emitted
        stats.generated += len(emitted)
        if eos_token_id in emitted:
            break
    return new_tokens, stats
