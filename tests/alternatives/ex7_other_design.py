"""A different CORRECT design for exercise 7, which its checker must accept: rollback copies the kept
positions (narrow + clone) instead of keeping a view; the draft remembers which tokens its cache holds
and keeps the longest prefix that equals the context, runs the catch-up tokens in a forward of their
own and always builds q through the processors; rejection sampling draws all k uniforms at once and
finds the first rejection with tensor operations; the decoding loop verifies greedy drafts on logits
penalised row by row with the given penalize_repetitions (no one-hot rejection sampling) and counts the
drafted tokens from the verified rows; Jacobi decoding starts from a prompt-lookup guess (the tokens
that followed the last earlier occurrence of the context's last token).

    pytest exercises/test_ex7_speculative.py --impl solutions --replace ex7_speculative=tests.alternatives.ex7_other_design
"""

import torch

from gpt import EOS_TOKEN_ID
from solutions.ex2_kv_cache import KVCache
from workshop.serving.sampling import GREEDY, penalize_repetitions
from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"


def rollback(cache, length):
    if length < 0 or length > len(cache):
        raise ValueError(f"cannot keep {length} of {len(cache)} positions.")
    cache.keys = [None if k is None else k.narrow(2, 0, length).clone() for k in cache.keys]
    cache.values = [None if v is None else v.narrow(2, 0, length).clone() for v in cache.values]


class DraftModel:
    def __init__(self, model):
        self.model = model
        self.cache = KVCache(model.config.n_layer)
        self.cached = []  # the tokens whose keys and values the cache holds
        self.forwards = 0

    @torch.no_grad()
    def propose(self, context, k, sampling=GREEDY, generator=None):
        keep = 0
        while keep < min(len(self.cached), len(context) - 1) and self.cached[keep] == context[keep]:
            keep += 1
        rollback(self.cache, keep)
        self.cached = list(context[:-1])
        if len(context) - keep > 1:  # catch up on everything but the last token first
            _reference.extend(self.model, self.cache, list(context[keep:-1]))
            self.forwards += 1
        token, tokens, probs = context[-1], [], []
        for _ in range(k):
            q = _reference.probabilities(_reference.extend(self.model, self.cache, [token]), sampling, [list(context) + tokens])[0]
            self.cached.append(token)
            self.forwards += 1
            token = int(q.argmax()) if sampling.greedy else int(torch.multinomial(q, 1, generator=generator))
            tokens.append(token)
            probs.append(q)
        return tokens, torch.stack(probs) if probs else torch.empty(0)


def accept_sampled(draft_tokens, draft_probs, target_probs, generator):
    k = len(draft_tokens)
    if k:
        index = torch.arange(k)
        drafted = torch.tensor(draft_tokens)
        uniforms = torch.rand(k, generator=generator)
        rejected = (uniforms * draft_probs[index, drafted] >= target_probs[index, drafted]).nonzero()
        if len(rejected):
            i = int(rejected[0])
            residual = (target_probs[i] - draft_probs[i]).clamp(min=0)
            return list(draft_tokens[:i]) + [int(torch.multinomial(residual if residual.sum() > 0 else target_probs[i], 1, generator=generator))]
    return list(draft_tokens) + [int(torch.multinomial(target_probs[k], 1, generator=generator))]


@torch.no_grad()
def jacobi_generate(target, prompt_ids, max_new_tokens, n=4, eos_token_id=EOS_TOKEN_ID):
    _reference.check_request(prompt_ids, max_new_tokens, target.config.n_positions, target.config.vocab_size)
    cache, tokens, stats = KVCache(target.config.n_layer), list(prompt_ids), _reference.SpeculativeStats()
    last = tokens[-1]
    earlier = [i for i in range(len(tokens) - 1) if tokens[i] == last]
    guesses = (tokens[earlier[-1] + 1:] if earlier else []) + [last] * n
    new_tokens = []
    while len(new_tokens) < max_new_tokens:
        guesses = guesses[: min(n, max_new_tokens - len(new_tokens) - 1)]
        logits = _reference.verify(target, cache, tokens, guesses)
        emitted = _reference.accept_greedy(guesses, logits)
        rollback(cache, len(tokens) + len(emitted) - 1)
        predictions = logits.argmax(dim=-1).tolist()[len(emitted):]
        guesses = predictions + [emitted[-1]] * n
        stats.target_forwards += 1
        stats.drafted += len(logits) - 1
        stats.accepted += len(emitted) - 1
        stop = eos_token_id in emitted
        emitted = emitted[: emitted.index(eos_token_id) + 1] if stop else emitted
        tokens += emitted
        new_tokens += emitted
        stats.generated += len(emitted)
        if stop:
            break
    return new_tokens, stats


class SpeculativeDecoder:
    def __init__(self, target, draft, prompt_ids, k=4, sampling=GREEDY, eos_token_id=EOS_TOKEN_ID):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a whole number >= 1, got {k!r}.")
        self.target, self.k, self.sampling, self.eos_token_id = target, k, sampling, eos_token_id
        self.draft = draft if hasattr(draft, "propose") else DraftModel(draft)
        self.cache = KVCache(target.config.n_layer)
        self.tokens = list(prompt_ids)
        self.generator = _reference.make_generator(sampling.seed)
        self.stats = _reference.SpeculativeStats()
        self.finished = False

    @torch.no_grad()
    def step(self, max_tokens):
        drafted, q = self.draft.propose(self.tokens, min(self.k, max_tokens - 1), self.sampling, self.generator) if max_tokens > 1 else ([], None)
        logits = _reference.verify(self.target, self.cache, self.tokens, drafted)
        rows = len(logits)
        known = self.tokens + list(drafted)
        histories = [known[: len(self.tokens) + i] for i in range(rows)]
        if self.sampling.greedy:
            if self.sampling.repetition_penalty != 1:
                logits = penalize_repetitions(logits.float(), histories, [self.sampling.repetition_penalty] * rows)
            emitted = _reference.accept_greedy(drafted, logits)
        else:
            emitted = accept_sampled(drafted, q, _reference.probabilities(logits, self.sampling, histories), self.generator)
        kept = len(emitted) - 1
        rollback(self.cache, len(self.tokens) + kept)
        if self.eos_token_id in emitted:
            emitted = emitted[: emitted.index(self.eos_token_id) + 1]
            self.finished = True
        self.tokens.extend(emitted)
        self.stats = _reference.SpeculativeStats(self.stats.target_forwards + 1, self.draft.forwards, self.stats.drafted + rows - 1,
                                                 self.stats.accepted + kept, self.stats.generated + len(emitted))
        return emitted


_reference = reference_with(EXERCISE, rollback=rollback, accept_sampled=accept_sampled)
_reference.DraftModel = DraftModel
_reference.SpeculativeDecoder = SpeculativeDecoder
_reference.jacobi_generate = jacobi_generate
globals().update(public_names(_reference))
