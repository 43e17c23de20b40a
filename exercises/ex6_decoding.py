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

Your part: the TODOs below, graded by `pytest exercises/test_ex6_decoding.py` (-k 6a, -k 6b, ...).
Stuck? exercises/hints/ex6.md has hints for each, from the idea to near-code.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: F401 (for your beam_search)

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
    # TODO (exercise 6a): logits [B, V], histories (B lists of token ids, of different lengths), penalties
    # (B numbers) -> new logits [B, V]. Row i, token t in histories[i] (once or many times: penalised once):
    # a positive logit divided by penalties[i], a negative one multiplied by it (penalty > 1 always makes t
    # less likely). Every other logit unchanged. Equal to transformers' RepetitionPenaltyLogitsProcessor.
    raise NotImplementedError("Exercise 6: implement apply_repetition_penalty() (penalise every token already in a row's history).")


def apply_temperature(logits, temperatures):
    """Divide each row by its temperature. Temperature 0 is greedy: the row keeps only its argmax
    (the first one, on a tie) and nothing is divided by zero."""
    # TODO (exercise 6a): logits [B, V] -> new [B, V]: row i divided by temperatures[i] (as transformers'
    # TemperatureLogitsWarper). Trap: temperature 0 is greedy, not a division: that row keeps only its
    # argmax (the first one on a tie) with its logit unchanged, every other token FILTERED; no inf or NaN.
    raise NotImplementedError("Exercise 6: implement apply_temperature() (divide by T per row; T = 0 keeps only the argmax).")


def apply_top_k(logits, top_ks):
    """Keep each row's top_k most likely tokens (and any tied with the k-th); 0 or >= vocab: all."""
    # TODO (exercise 6a): logits [B, V] -> new [B, V]: row i keeps its top_ks[i] highest logits, the rest
    # FILTERED; rows have different k. top_k 0, or >= V, keeps everything. Tie rule: a token tied with the
    # k-th highest is kept too (a row may keep more than k). Equal to transformers' TopKLogitsWarper.
    raise NotImplementedError("Exercise 6: implement apply_top_k() (keep each row's k highest logits, ties with the k-th included).")


def apply_top_p(logits, top_ps):
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches top_p,
    including the token that crosses it, and always the most likely one. Said the other way round
    (as computed): drop the least likely tokens as long as together they weigh at most 1 - top_p."""
    # TODO (exercise 6a): logits [B, V] -> new [B, V]: row i keeps the smallest set of most likely tokens
    # whose probabilities (softmax of the row) add up to at least top_ps[i]; the token that crosses top_p is
    # kept, the most likely token always is; the rest FILTERED. top_p = 1 keeps every token with a non-zero
    # probability. Tie rule: a token whose logit equals the lowest kept logit is kept too.
    # Trap (rounding): the checker compares with transformers' TopPLogitsWarper token for token. It decides
    # from the other end: a token goes when its probability plus that of every LESS likely token is
    # <= 1 - top_p (computed in Python, then compared in float32). Summing 50,257 probabilities from the top
    # instead rounds differently by far more than a float32 step (only tokens within rounding of that
    # boundary, 1e-6, may go either way).
    raise NotImplementedError("Exercise 6: implement apply_top_p() (keep the smallest most-likely set whose probability reaches p).")


def apply_min_p(logits, min_ps):
    """Keep the tokens at least min_p times as likely as the row's most likely token."""
    # TODO (exercise 6a): logits [B, V] -> new [B, V]: in row i every token whose probability is below
    # min_ps[i] times that of the row's most likely token becomes FILTERED. min_p = 0 keeps everything.
    # Equal to transformers' MinPLogitsWarper.
    raise NotImplementedError("Exercise 6: implement apply_min_p() (drop tokens less likely than min_p x the best one).")


# ----------------------------------------------------------------------------------------------
# 6b: the sampler

def filter_logits(logits, params, histories=None):
    """The processors in the course's order, each row with its own SamplingParams; a processor that
    no row uses is skipped. histories: each row's tokens so far (for the repetition penalty)."""
    # TODO (exercise 6b): logits [B, V] (any float dtype) -> float32 [B, V], row i filtered by params[i] (a
    # SamplingParams) exactly as transformers' chain repetition penalty -> temperature -> top-k -> top-p ->
    # min-p would (the order matters: temperature changes what top-p and min-p cut). A greedy row keeps only
    # the argmax of its penalised logits. A processor no row uses (repetition_penalty 1, top_k 0, top_p 1,
    # min_p 0) must cost nothing: top-p sorts the whole vocabulary. histories may be None when no row has a
    # repetition penalty.
    raise NotImplementedError("Exercise 6: implement filter_logits() (the processors in order, per-row parameters).")


def draw_multinomial(probs, generators):
    """One token per row of probs [B, V], drawn with that row's torch.Generator."""
    # TODO (exercise 6b): probs [B, V] (rows sum to 1) -> a list of B Python ints, token of row i drawn with
    # probability probs[i] using generators[i] and nothing else: a row's token depends only on its own
    # generator and probabilities, never on its place in the batch or its neighbours' generators (the same
    # generator object may appear in several rows: it then serves them in turn). Never a zero-probability token.
    raise NotImplementedError("Exercise 6: implement draw_multinomial() (one draw per row, with that row's generator).")


def draw_exponential_race(probs, generators):
    """One token per row, as argmax(p_i / E_i) with E_i ~ Exp(1) drawn with the row's generator.

    Token i "arrives" at time E_i / p_i, exponential with rate p_i; the first to arrive is token i with
    probability p_i / sum(p). (Taking logs: argmax(log p_i + G_i) with Gumbel noise G_i = -log E_i, the
    Gumbel-max trick.) No cumulative sum and no search: a GPU does it without waiting on the host."""
    # TODO (exercise 6b): the same contract as draw_multinomial (a list of B ints, row i's noise from
    # generators[i] only), by the race in the docstring: V independent Exp(1) arrival times per row, one
    # vectorised argmax, no cumulative sum. Trap: drawing the whole [B, V] noise from one generator has the
    # right distribution, but a request's token then depends on its neighbours: the checker shuffles them.
    raise NotImplementedError("Exercise 6: implement draw_exponential_race() (argmax of p / E, E ~ Exp(1), per row).")


def sample(logits, params, generators, histories=None, draw=None):
    """The next token of each row of logits [B, V]: row i by params[i] (a SamplingParams) with
    generators[i] (a seeded CPU torch.Generator; unused for a greedy row). Greedy rows take the
    argmax of the filtered logits; sampled rows draw from their softmax, on the CPU, so a seed gives
    the same tokens on any device and in any batch. draw: draw_multinomial (None) or draw_exponential_race."""
    # TODO (exercise 6b): a list of B Python ints, the next token of every row.
    #   - a greedy row (temperature 0) takes the argmax of its FILTERED logits (a repetition penalty still
    #     applies) and draws nothing: its generator is not touched;
    #   - a sampled row draws from the softmax of its filtered logits, on the CPU, with
    #     draw(probs, generators) (None: draw_multinomial), its own generator only;
    #   - a batch of greedy rows without a repetition penalty costs one argmax, no filtering.
    raise NotImplementedError("Exercise 6: implement sample() (filter, then argmax for greedy rows and a seeded draw for the others).")


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
    # TODO (exercise 6c): up to num_beams Hypothesis(tokens, score), best first, equal (tokens, order and
    # scores) to transformers' generate(num_beams, do_sample=False, early_stopping=False): the docstring's
    # rules are that contract. Use exercise 2's KVCache and forward: one prefill of the prompt, then the new
    # tokens through the cache (the beams may run as the rows of one batch). Invariants and traps:
    #   - a beam's score is the total log-probability (log_softmax in float32) of its tokens; a finished
    #     hypothesis scores total / len(tokens) ** length_penalty, its EOS counted in len;
    #   - after each step, a beam's cache row must hold ITS OWN past: a new beam continues its parent's keys
    #     and values, whichever row the parent had (two beams may share a parent);
    #   - the search starts from ONE beam (the prompt), not num_beams copies (they would tie);
    #   - refuse num_beams < 1 (and a bad request, as check_request does) with one clear sentence.
    raise NotImplementedError("Exercise 6: implement beam_search() (keep the num_beams best partial sequences, as transformers does).")


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
        # TODO (exercise 6d): record `token` (in self.token_ids, stop tokens included) and return the text that
        # became safe to show. The contract (the class docstring) and its invariants:
        #   - finish_reason: "stop" on a stop token id or a stop string anywhere in the decoded new text (even
        #     one spread over several tokens; the earliest one wins), else "length" at max_new_tokens;
        #   - self.text: the decoded new tokens (stop tokens' text left out), cut where a stop string starts;
        #   - streaming: the pieces add() returns add up to the final self.text, in every finishing way (a stop
        #     token, a stop string, max_new_tokens): once finished, nothing held back can change any more.
        #     Before that, never show what may still become a stop string, nor half a UTF-8 character;
        #   - add() after the request finished is the caller's bug: RuntimeError.
        raise NotImplementedError("Exercise 6: implement StopChecker.add() (stop tokens, stop strings in the text, max tokens; stream what is safe).")

    def _safe_length(self):
        """How much of the text cannot change any more: up to an incomplete character at the end, and
        up to the earliest suffix that is the beginning of a stop string."""
        # TODO (exercise 6d, a helper for add; fold it in there if you prefer): how many characters of
        # self.text can no longer change. Hold back a last character "\ufffd" (half a UTF-8 character: the
        # next token completes it), and the earliest suffix of the text that is the beginning of a stop
        # string ("Hello wor" with stop "world": "wor" waits; "Hello wok" is all safe).
        raise NotImplementedError("Exercise 6: implement StopChecker._safe_length() (hold back what may still become a stop string).")


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
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
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
