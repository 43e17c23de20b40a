"""Exercise 7: speculative decoding.

A decode step reads every weight of the model to produce one token: it is bound by moving weights,
not by arithmetic. So a small *draft* model proposes k tokens (k cheap steps), and the large
*target* scores all k + 1 positions in ONE forward, about the price of a single step. The target
keeps the longest prefix it agrees with and adds one token of its own, so every round yields between
1 and k + 1 tokens for one target forward.

    context ... t | draft: d1 d2 d3 d4 | target, one forward over [t d1 d2 d3 d4]:
                  |         ok ok no   | -> emit d1 d2 and the target's own token at d3's place

Nothing about the output changes: greedy verification gives exactly the target's greedy tokens, and
rejection sampling gives exactly the target's sampling distribution (Leviathan et al. 2023, Chen et
al. 2023). Only the speed depends on the draft: on how often it agrees (alpha) and what it costs.

    7a  drafting: the draft proposes k tokens, one forward each, with its own KV cache
    7b  verification: the target scores the k + 1 positions in one forward; greedy acceptance
    7c  rejection sampling: accept with probability min(1, p/q), else draw from max(p - q, 0)
    7d  rolling a KV cache back to the accepted length
    7e  the decoding loop and its statistics (acceptance rate, tokens per target forward)
    7f  stretch: Jacobi decoding, where the target's own earlier predictions are the draft

Your part: the TODOs below, graded by `pytest exercises/test_ex7_speculative.py` (-k 7a, -k 7b, ...).
Stuck? exercises/hints/ex7.md has hints for each, from the idea to near-code.
"""

import copy
from dataclasses import dataclass

import torch

from gpt import EOS_TOKEN_ID, check_request, check_token_ids

# exercise 2's reference, never your own; sampling is given code (workshop/serving/sampling.py), not exercise 6's answer
from solutions.ex2_kv_cache import KVCache, forward
from workshop.serving.sampling import GREEDY, SamplingParams, filter_logits, make_generator  # noqa: F401 (SamplingParams: for your tests)


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
    # TODO (exercise 7d). Contract:
    # - afterwards len(cache) == length, every layer holds exactly the keys and values it held at positions
    #   0 .. length-1 (cache.keys[layer] is [B, n_head, T, head_dim], or None while the cache is empty), and
    #   the next update() appends right after them;
    # - an empty cache rolled back to 0 stays empty, without error;
    # - a length outside 0 .. len(cache) is the caller's bug: raise ValueError saying so, in one sentence.
    raise NotImplementedError("Exercise 7: implement rollback() (7d: keep the first `length` positions of every layer).")


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
        # TODO (exercise 7a). Contract:
        # - tokens: a list of k ints, the draft's own continuation of context: exactly what the draft would
        #   produce from context with a fresh cache (greedy: its argmax; sampled: drawn from q with
        #   `generator`, the only source of randomness);
        # - probs [k, vocab] on the CPU: row i is q, the distribution token i was drawn from, i.e. the draft's
        #   logits after context + tokens[:i] through probabilities() (the repetition penalty's history is
        #   context + tokens[:i]); greedy rows are one-hot;
        # - cost: k forwards (k + 1 allowed), over only what the cache does not hold yet: never the prompt again;
        # - self.forwards counts every forward of the draft.
        # Trap: the cache may still hold drafts of the last round that the target rejected; each context
        # extends the last one by some of those drafts and one token of the target's.
        raise NotImplementedError("Exercise 7: implement DraftModel.propose() (7a: k draft tokens, one forward each, with the draft's cache).")


# ----------------------------------------------------------------------------------------------
# 7b: verification, greedy

def verify(model, cache, context, draft_tokens):
    """ONE forward of the target over the tokens of context not yet in its cache (at least the last
    one) followed by the k draft tokens. Returns logits [k + 1, vocab]: row i is the target's
    next-token logits after context + draft_tokens[:i]. The k + 1 queries come after the cached
    keys, so the causal mask is lower-right aligned (exercise 2's forward builds it so)."""
    check_token_ids(list(context) + list(draft_tokens), model.config.vocab_size, "context + draft token")  # given: on the host
    # TODO (exercise 7b). Contract: exactly one forward of the target, over only what its cache lacks
    # (the cache holds a prefix of context without its last token: none of it on the first round, all but that
    # token after) and the k drafts; afterwards the cache holds context + draft_tokens. Returns [k + 1, vocab] (k may be 0: one row).
    raise NotImplementedError("Exercise 7: implement verify() (7b: the target scores the k + 1 positions in one forward).")


def accept_greedy(draft_tokens, target_logits):
    """The longest prefix of draft_tokens that equals the target's argmax, then the target's own next
    token: a correction at the first disagreement, or a bonus token when all k agree (1 to k + 1 tokens)."""
    # TODO (exercise 7b). Contract: target_logits [k + 1, vocab], row i the target's prediction where
    # draft_tokens[i] stands. Returns a list of 1 to k + 1 ints: what the target's own greedy decoding
    # would write next, as far as these k + 1 rows can tell (k may be 0).
    raise NotImplementedError("Exercise 7: implement accept_greedy() (7b: the agreeing prefix plus the target's next token).")


# ----------------------------------------------------------------------------------------------
# 7c: verification, rejection sampling

def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    """Rejection sampling. Draft token i (drawn from q = draft_probs[i]) is accepted with probability
    min(1, p / q), p = target_probs[i]. At the first rejection, one token is drawn from
    normalize(max(p - q, 0)) and the round ends; when all k are accepted, a bonus token is drawn from
    target_probs[k]. Each emitted token is then distributed exactly as the target's p."""
    # TODO (exercise 7c). Contract: draft_probs [k, vocab] (q), target_probs [k + 1, vocab] (p), both on the
    # CPU; k may be 0. Returns a list of 1 to k + 1 ints such that:
    # - each emitted token is distributed exactly as the target's p at its position, whatever q is;
    # - a draft token is kept with probability min(1, p/q) at its token, so one draft is accepted with
    #   probability sum(min(p, q)); a token with p = 0 is never emitted;
    # - every random draw comes from `generator` (same generator state, same output).
    # Trap: p - q can be all <= 0 through rounding when p == q.
    raise NotImplementedError("Exercise 7: implement accept_sampled() (7c: min(1, p/q), then max(p - q, 0) or the bonus).")


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
        # TODO (exercise 7e): accepted / drafted, 0.0 before any draft (no division by zero).
        raise NotImplementedError("Exercise 7: implement SpeculativeStats.acceptance_rate (7e).")

    @property
    def tokens_per_target_forward(self):
        # TODO (exercise 7e): generated / target_forwards, 0.0 before any forward: what speculation buys.
        raise NotImplementedError("Exercise 7: implement SpeculativeStats.tokens_per_target_forward (7e).")


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
        # TODO (exercise 7e): one round with 7a-7d. Contract:
        # - output: greedy sampling returns exactly the target's own greedy tokens under self.sampling,
        #   repetition penalty included; any other sampling, tokens distributed as the target's;
        # - the repetition penalty's history of the target's prediction at a verified position is everything
        #   before that position: self.tokens and the drafted tokens before it;
        # - one target forward per round; never draft what could not be returned (at most max_tokens - 1);
        #   the draft may return fewer tokens than asked;
        # - the tokens are cut right after EOS (which sets self.finished), then appended to self.tokens;
        #   afterwards the target's cache holds exactly self.tokens[:-1] (after the round that returns the EOS,
        #   nothing reads it again: it may still hold the tokens cut off);
        # - self.stats: target_forwards + 1; drafted + the draft tokens this round really proposed (fewer
        #   than self.k in a last round); accepted + the drafts kept; generated + the tokens returned;
        #   draft_forwards = self.draft.forwards.
        raise NotImplementedError("Exercise 7: implement SpeculativeDecoder.step() (7e: draft, verify, accept, roll back).")


def speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, sampling=GREEDY, eos_token_id=EOS_TOKEN_ID):
    """Speculative decoding: the same tokens as exercise 2's greedy generate (greedy sampling) or the
    same distribution as sampling from the target (any other SamplingParams). Returns (new tokens, stats)."""
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
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
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
    check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    # TODO (exercise 7f). Contract:
    # - no draft model; exactly the target's greedy tokens, up to max_new_tokens, and after the first EOS the
    #   target produces, nothing: no token (a forward may keep guesses past the EOS: cut them off; a guess or a
    #   prediction that was not kept stops nothing) and no forward;
    # - each forward runs the text's last token (its keys and values are not cached yet) and at most n guesses,
    #   n whenever max_new_tokens leaves room, never a position past max_new_tokens (at most
    #   max_new_tokens - generated - 1 guesses); each forward yields at least one token, and the guesses must
    #   come true often enough that the forwards are fewer than the tokens;
    # - a SpeculativeStats, counted as in 7e: target_forwards + 1 per forward; drafted + the guesses it verified;
    #   accepted + the guesses the verification kept (never more than drafted); generated + the tokens returned;
    #   draft_forwards stays 0 (no draft model). Without an EOS, every forward returns the guesses it kept and
    #   one token of the target's own: generated = accepted + target_forwards.
    # Returns (new tokens, stats).
    raise NotImplementedError("Exercise 7: implement jacobi_generate() (7f: the target's own predictions as the draft).")
