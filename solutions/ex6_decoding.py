"""Exercise 6: decoding strategies. The model gives logits; how we turn them into tokens is a choice.

    logits [B, vocab] --repetition penalty--> --temperature--> --top-k--> --top-p--> --min-p--> draw a token

Greedy (argmax) repeats itself and can miss a likely sentence hidden behind an unlikely first word.
Sampling draws from softmax(logits / T): T < 1 sharpens the distribution, T > 1 flattens it, T = 0 is
greedy. Top-k keeps the k most likely tokens, top-p the smallest set whose probability reaches p,
min-p the tokens at least min_p times as likely as the best: each cuts the unreliable tail. They are
applied in that order (the course's, and transformers'), each row of the batch with its own
parameters, so greedy and sampled requests share one batch in an engine.

    6a  the processors, batched, equal to transformers' TemperatureLogitsWarper, TopKLogitsWarper,
        TopPLogitsWarper, MinPLogitsWarper and RepetitionPenaltyLogitsProcessor
    6b  the sampler: the processors in order, then a draw per row with that row's seeded generator
        (multinomial, or the exponential race: argmax(p / E) with E ~ Exp(1), the Gumbel-max trick)
    6c  beam search: keep the num_beams best partial sequences by total log-probability
    6d  stopping: stop token ids, stop strings found in the decoded text (across token boundaries)
        and trimmed, max_new_tokens; streaming holds back text that may still become a stop string

Tie rule (top-k and top-p): a token is kept when its logit is >= the lowest logit the rule keeps, so
tokens tied with the last one kept are all kept (transformers' top-k does the same; its top-p breaks
such a tie by sort order, which torch leaves unspecified).

Given (workshop/serving/sampling.py, the engines' own batched sampler): SamplingParams (one request's temperature,
top_k, top_p, min_p, repetition_penalty, seed), GREEDY and make_generator(seed). The engines of exercises 4,
5 and 7 sample with workshop.serving.sampling; here you write each piece yourself and compare with transformers.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache, forward  # the reference, never your exercise 2
from workshop.serving.sampling import GREEDY, SamplingParams, make_generator  # noqa: F401 (given: the engines' request parameters)

FILTERED = -float("inf")  # the logit of a token a processor removes: probability exactly 0


def _per_row(values, logits, dtype=None):
    """One parameter per row of logits, as a column [B, 1] on logits' device."""
    return torch.as_tensor(values, dtype=dtype or logits.dtype, device=logits.device).view(-1, 1)


# ----------------------------------------------------------------------------------------------
# 6a: the logits processors. Each takes logits [B, V] and one parameter per row; returns new logits.

def apply_repetition_penalty(logits, histories, penalties):
    """CTRL's repetition penalty: every token already in a row's history (prompt and output) becomes
    less likely: a positive logit is divided by the penalty, a negative one multiplied by it."""
    seen = torch.zeros(logits.shape[0], logits.shape[1] + 1, dtype=torch.bool, device=logits.device)
    width = max(map(len, histories), default=0)
    ids = torch.tensor([list(h) + [logits.shape[1]] * (width - len(h)) for h in histories], dtype=torch.long,
                       device=logits.device).view(len(histories), width)  # padded with V: a column we drop
    seen.scatter_(1, ids, True)
    seen = seen[:, :-1]
    penalty = _per_row(penalties, logits)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def apply_temperature(logits, temperatures):
    """Divide each row by its temperature. Temperature 0 is greedy: the row keeps only its argmax
    (the first one, on a tie) and nothing is divided by zero."""
    t = _per_row(temperatures, logits)
    greedy = t == 0
    scaled = logits / torch.where(greedy, torch.ones_like(t), t)
    if not greedy.any():
        return scaled
    best = logits.max(dim=1, keepdim=True)  # values and indices in one pass; the first index on a tie
    argmax_only = torch.full_like(logits, FILTERED).scatter(1, best.indices, best.values)
    return torch.where(greedy, argmax_only, scaled)


def apply_top_k(logits, top_ks):
    """Keep each row's top_k most likely tokens (and any tied with the k-th); 0 or >= vocab: all."""
    vocab = logits.shape[1]
    k = torch.as_tensor(top_ks, dtype=torch.long, device=logits.device).view(-1, 1)
    k = torch.where((k <= 0) | (k > vocab), vocab, k)
    kth_largest = logits.topk(int(k.max()), dim=1).values.gather(1, k - 1)  # no full sort when every k is small
    return logits.masked_fill(logits < kth_largest, FILTERED)


def apply_top_p(logits, top_ps):
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches top_p,
    including the token that crosses it, and always the most likely one. Said the other way round
    (as computed): drop the least likely tokens as long as together they weigh at most 1 - top_p."""
    ascending = logits.sort(dim=1).values
    tail_mass = ascending.softmax(dim=1).cumsum(dim=1)  # probability of this token and every less likely one
    # 1 - top_p in Python, rounded once to float32, as transformers compares it (a Python float against a
    # float32 tensor); 1 - top_p computed in float32 rounds twice and moves the boundary by one float32 step.
    dropped = tail_mass <= _per_row([1 - float(p) for p in top_ps], logits)
    dropped[:, -1] = False  # the most likely token always stays
    lowest_kept = ascending.masked_fill(dropped, float("inf")).min(dim=1, keepdim=True).values
    return logits.masked_fill(logits < lowest_kept, FILTERED)  # tie rule: all tokens tied with it stay too


def apply_min_p(logits, min_ps):
    """Keep the tokens at least min_p times as likely as the row's most likely token."""
    probs = logits.softmax(dim=1)
    threshold = _per_row(min_ps, logits) * probs.max(dim=1, keepdim=True).values
    return logits.masked_fill(probs < threshold, FILTERED)


# ----------------------------------------------------------------------------------------------
# 6b: the sampler

def filter_logits(logits, params, histories=None):
    """The processors in the course's order, each row with its own SamplingParams; a processor that
    no row uses is skipped. histories: each row's tokens so far (for the repetition penalty)."""
    logits = logits.float()
    if any(p.repetition_penalty != 1 for p in params):
        logits = apply_repetition_penalty(logits, histories, [p.repetition_penalty for p in params])
    logits = apply_temperature(logits, [p.temperature for p in params])
    if any(0 < p.top_k < logits.shape[1] for p in params):
        logits = apply_top_k(logits, [p.top_k for p in params])
    if any(p.top_p < 1 for p in params):
        logits = apply_top_p(logits, [p.top_p for p in params])
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, [p.min_p for p in params])
    return logits


def draw_multinomial(probs, generators):
    """One token per row of probs [B, V], drawn with that row's torch.Generator."""
    return [int(torch.multinomial(row, 1, generator=g)) for row, g in zip(probs, generators)]


def draw_exponential_race(probs, generators):
    """One token per row, as argmax(p_i / E_i) with E_i ~ Exp(1) drawn with the row's generator.

    Token i "arrives" at time E_i / p_i, exponential with rate p_i; the first to arrive is token i with
    probability p_i / sum(p). (Taking logs: argmax(log p_i + G_i) with Gumbel noise G_i = -log E_i, the
    Gumbel-max trick.) No cumulative sum and no search: a GPU does it without waiting on the host."""
    arrival = torch.stack([torch.empty(probs.shape[1]).exponential_(generator=g) for g in generators])
    return (probs / arrival).argmax(dim=1).tolist()


def sample(logits, params, generators, histories=None, draw=None):
    """The next token of each row of logits [B, V]: row i by params[i] (a SamplingParams) with
    generators[i] (a seeded CPU torch.Generator; unused for a greedy row). Greedy rows take the
    argmax of the filtered logits; sampled rows draw from their softmax, on the CPU, so a seed gives
    the same tokens on any device and in any batch. draw: draw_multinomial (None) or draw_exponential_race."""
    if all(p.greedy and p.repetition_penalty == 1 for p in params):  # nothing to filter: the argmax
        return logits.argmax(dim=1).tolist()
    logits = filter_logits(logits, params, histories)
    tokens = logits.argmax(dim=1).tolist()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        probs = logits[rows].softmax(dim=1).cpu()
        for i, token in zip(rows, (draw or draw_multinomial)(probs, [generators[i] for i in rows])):
            tokens[i] = token
    return tokens


# ----------------------------------------------------------------------------------------------
# 6c: beam search

@dataclass
class Hypothesis:
    tokens: list  # the new tokens (the EOS token included when it ended the hypothesis)
    score: float  # total log-probability / len(tokens) ** length_penalty


@torch.no_grad()
def beam_search(model, prompt_ids, num_beams, max_new_tokens, length_penalty=1.0, eos_token_id=EOS_TOKEN_ID):
    """Keep the num_beams partial sequences with the highest total log-probability; return the
    num_beams best finished hypotheses, best first (as transformers' generate(num_beams=...,
    do_sample=False, early_stopping=False) ranks them).

    Each step scores every (beam, next token) pair and takes the 2 * num_beams best, in order: a
    candidate ending in EOS (or reaching max_new_tokens) is a finished hypothesis if it ranks among the
    first num_beams, scored total / length ** length_penalty (length_penalty > 0 favours longer ones);
    the first num_beams other candidates are the next beams. Stop when max_new_tokens is reached, or
    when num_beams hypotheses are finished and the best running beam, scored at its current length,
    could not beat the worst of them."""
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    if num_beams < 1:
        raise ValueError(f"num_beams is {num_beams}: beam search needs at least 1 beam (1 is greedy).")
    kv_cache = KVCache(model.config.n_layer)
    logits = forward(model, torch.tensor([prompt_ids], device=model.device),
                     torch.arange(len(prompt_ids), device=model.device)[None], kv_cache)[:, -1]
    beams, scores, finished = [[]], torch.zeros(1), []
    for step in range(max_new_tokens):
        totals = scores[:, None] + F.log_softmax(logits.float().cpu(), dim=-1)  # [beams, V]
        top = totals.flatten().topk(2 * num_beams)
        last_step = step + 1 == max_new_tokens
        parents, next_beams, next_scores = [], [], []
        for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parent, token = divmod(index, totals.shape[1])
            tokens = beams[parent] + [token]
            if token == eos_token_id or last_step:
                if rank < num_beams:  # only the top num_beams candidates may finish
                    finished.append(Hypothesis(tokens, total / len(tokens) ** length_penalty))
            elif len(next_beams) < num_beams:
                parents.append(parent), next_beams.append(tokens), next_scores.append(total)
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:num_beams]
        if last_step or (len(finished) == num_beams and next_scores[0] / (step + 1) ** length_penalty <= finished[-1].score):
            break
        beams, scores = next_beams, torch.tensor(next_scores)
        rows = torch.tensor(parents, device=model.device)
        kv_cache.keys = [k[rows] for k in kv_cache.keys]  # each new beam continues its parent's cache
        kv_cache.values = [v[rows] for v in kv_cache.values]
        new_tokens = torch.tensor([[tokens[-1]] for tokens in beams], device=model.device)
        positions = torch.full_like(new_tokens, len(prompt_ids) + step)  # the token chosen at step s sits at prompt + s
        logits = forward(model, new_tokens, positions, kv_cache)[:, -1]
    return finished


# ----------------------------------------------------------------------------------------------
# 6d: stopping, and the generation loop that puts it all together

class StopChecker:
    """Decides when one request stops and which of its text may be shown yet.

    add(token) after every new token returns the text that became safe to stream. It stops on a stop
    token id (its text is not shown), on a stop string anywhere in the decoded output, even one spread
    over several tokens (the text is cut where the stop string starts), or at max_new_tokens. Text
    that could still turn out to be the start of a stop string is held back until it cannot, and so is
    an incomplete UTF-8 character (a byte-level token can end in the middle of one): the pieces streamed
    add up to the final text, and never show a stop string or any part of one.
    """

    def __init__(self, tokenizer, stop=(), stop_token_ids=(EOS_TOKEN_ID,), max_new_tokens=None):
        stop = [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}: remove the empty ones.")
        self.tokenizer, self.stop, self.stop_token_ids = tokenizer, stop, set(stop_token_ids)
        self.max_new_tokens = max_new_tokens
        self.token_ids = []  # every new token, the stopping one included (as transformers returns them)
        self.text = ""  # the final text once finished; the text so far before that
        self.sent = 0  # characters of text already returned by add()
        self.finish_reason = None  # "stop" (stop token or stop string) or "length" (max_new_tokens)

    @property
    def finished(self):
        return self.finish_reason is not None

    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            self.text = self.tokenizer.decode([t for t in self.token_ids if t not in self.stop_token_ids])
            found = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
            if found:
                self.text, self.finish_reason = self.text[:min(found)], "stop"
            elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finished else self._safe_length()
        piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return piece

    def _safe_length(self):
        """How much of the text cannot change any more: up to an incomplete character at the end, and
        up to the earliest suffix that is the beginning of a stop string."""
        text = self.text.removesuffix("\ufffd")  # half a UTF-8 character
        for start in range(max(0, len(text) - max(map(len, self.stop), default=0) + 1), len(text)):
            if any(s.startswith(text[start:]) for s in self.stop):
                return start
        return len(text)


@dataclass
class Completion:
    token_ids: list  # the new tokens, the stopping one included
    text: str  # the new text, cut before a stop string, without a stop token's text
    finish_reason: str  # "stop" or "length"


@torch.no_grad()
def generate(model, tokenizer, prompt_ids, max_new_tokens, sampling=GREEDY, stop=(), stop_token_ids=(EOS_TOKEN_ID,), on_text=None):
    """One request, decoded by `sampling` (a SamplingParams) with a KV cache, until a stop token, a stop
    string or max_new_tokens. on_text(piece), if given, is called with each piece of text as soon as it
    is safe to show (streaming). Returns a Completion."""
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    checker = StopChecker(tokenizer, stop, stop_token_ids, max_new_tokens)
    generator = make_generator(sampling.seed)
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    while not checker.finished:
        logits = forward(model, input_ids, position_ids, kv_cache)[:, -1]
        token = sample(logits, [sampling], [generator], [list(prompt_ids) + checker.token_ids])[0]
        piece = checker.add(token)
        if piece and on_text:
            on_text(piece)
        input_ids, position_ids = torch.tensor([[token]], device=model.device), position_ids[:, -1:] + 1
    return Completion(checker.token_ids, checker.text, checker.finish_reason)
