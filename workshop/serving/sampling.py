"""The engines' sampler: given code, not an exercise's answer. Exercise 6 teaches the logits
processors one by one; the engines of exercises 4, 5 and 7 (and the server) sample with this module,
so that no stub depends on the reference of a later exercise.

One vectorised pass per step over the whole batch, as vLLM's sampler does: every parameter is a
per-row tensor (temperature, top-k, top-p, min-p, repetition penalty), greedy and sampled rows share
the batch, and a processor no row uses costs nothing (flags on the host decide, from the parameters).
Each sampled row inverts its own cumulative distribution at a uniform number from its own seeded
generator (token t of a row: the generator's t-th draw), so a request's tokens depend on its seed and
its logits only: not on its place in the batch, nor on its neighbours.

The state persists between steps, as in vLLM V1's persistent batch: the rows' parameters, the tokens
each row has seen (for the repetition penalty) and a window of each row's next uniforms live on the
logits' device, built when the rows change and reused while the same rows come back one token
further. A steady decode step then launches a few kernels and reads nothing back to the host.

    sample_ids(logits, params, generators, histories)   LongTensor [B] on logits' device, no host read
    sample(logits, params, generators, histories)       the same as a list of ints: one read, .tolist()
"""

import threading
import weakref
from dataclasses import dataclass

import torch

FILTERED = -float("inf")  # the logit of a removed token: probability exactly 0
AHEAD = 64  # steps a batch state runs on its uploaded uniforms; generators are drawn ahead by as many
# The largest uniform used: a float64 draw just below 1 is 1.0 once rounded to float32, and 1.0 x T
# is T. For a float32 total T > 0 in [2**e, 2**(e+1)), u <= 1 - 2**-23 gives u * T <= T - T * 2**-23
# <= T - 2**(e-23) = T - ulp(T), itself a float32; rounding to nearest is monotone, so
# float32(u * T) <= T - ulp(T) < T: a whole step of margin.
U_MAX = 1 - 2 ** -23


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
    """A CPU generator for this sampler: seeded when seed is not None, else with a fresh nondeterministic seed."""
    generator = StreamGenerator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed % 2**64)  # torch takes [0, 2**64); a negative seed wraps as in numpy's uint64
    return generator


# ----------------------------------------------------------------------------------------------
# Each generator's uniforms, drawn ahead

class _Stream:
    """A generator's float64 uniforms drawn ahead: numbers[i] is its (start + i)-th draw. `used` counts the
    draws handed out (a host counter: no tensor is ever read to know where a row is)."""

    def __init__(self):
        self.numbers, self.start, self.used = None, 0, 0  # no draw yet

    def ahead(self, generator, count, rank=0, every=1):
        """Draws rank, rank + every, ... of the next `count` not handed out yet; when short, draws enough
        for AHEAD more (n draws at once are the same numbers as n draws one by one: no token changes)."""
        first = self.used - self.start
        left = 0 if self.numbers is None else self.numbers.shape[0] - first
        if left < count:
            more = torch.rand(-(-(count + AHEAD - left) // AHEAD) * AHEAD, generator=generator, dtype=torch.float64)
            self.numbers = torch.cat([self.numbers[first:], more]) if left else more
            self.start, first = self.used, 0
        return self.numbers[first + rank:first + count:every]


class StreamGenerator(torch.Generator):
    """A torch.Generator that carries its stream: the uniforms drawn ahead for it. The stream lives on the
    generator because torch.Generator takes no attribute, and before torch 2.13 no weak reference either
    (a WeakKeyDictionary keyed by generators fails on the torch GPU images ship); a subclass takes both.
    A copy (copy.deepcopy, pickle) copies the stream too: it draws what the original would."""

    def __init__(self):
        super().__init__()
        self.stream = _Stream()

    def __reduce__(self):
        return _rebuilt_generator, (self.get_state(), self.stream)


def _rebuilt_generator(state, stream):
    generator = StreamGenerator()
    generator.set_state(state)
    generator.stream = stream
    return generator


_streams = weakref.WeakKeyDictionary()  # a plain torch.Generator's stream (torch >= 2.13): a row that leaves and comes back loses no draw
_streams_lock = threading.Lock()


def _stream(generator):
    if isinstance(generator, StreamGenerator):
        return generator.stream
    with _streams_lock:
        try:
            stream = _streams.get(generator)
            if stream is None:
                stream = _streams[generator] = _Stream()
        except TypeError:  # torch < 2.13: no weak reference to a torch.Generator
            raise ValueError(f"this sampler keeps each generator's draws beside it, and torch {torch.__version__}'s "
                             f"torch.Generator cannot hold them: make the generators with make_generator(seed).") from None
        return stream


def _to_device(tensor, device):
    """A host tensor on the device; from pinned memory on CUDA, so that the copy waits for no kernel."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _column(values, dtype, device):
    return _to_device(torch.tensor(values, dtype=dtype).view(-1, 1), device)


def _seen_tokens(histories, rows, vocab, device):
    """[B, V] booleans: True where the token is in the row's history, for the rows listed in `rows`."""
    width = max((len(histories[i]) for i in rows), default=0)
    ids = [list(histories[i]) + [vocab] * (width - len(histories[i])) if i in rows else [vocab] * width
           for i in range(len(histories))]  # padded with V: a column we drop
    ids = _to_device(torch.tensor(ids, dtype=torch.long).view(len(histories), width), device)
    return torch.zeros(len(histories), vocab + 1, dtype=torch.bool, device=device).scatter_(1, ids, True)[:, :vocab]


def _penalize(logits, seen, penalty):
    """CTRL's repetition penalty: a token already seen has a positive logit divided by the penalty, a
    negative one multiplied by it (both make it less likely)."""
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def penalize_repetitions(logits, histories, penalties):
    """CTRL's repetition penalty, every row at once, for token ids `histories` (prompt and output)."""
    rows = range(len(histories))
    seen = _seen_tokens(histories, rows, logits.shape[1], logits.device)
    return _penalize(logits, seen, _column(penalties, logits.dtype, logits.device))


# ----------------------------------------------------------------------------------------------
# The batch state

class BatchSampler:
    """The sampling state of one batch of rows, on the logits' device: each row's parameters, the tokens
    it has seen (rows with a repetition penalty) and a window of AHEAD uniforms from its generator,
    with the index of the next one. Built once for a set of rows; step() samples them one token further.

    Which processors run is decided here, on the host, from the parameters: top-k, top-p and min-p only
    if a sampled row uses them (`flag_rows`: the rows whose use counts), the division only if a
    temperature is neither 0 nor 1. Greedy rows take the argmax of their penalised logits."""

    def __init__(self, params, generators, histories, vocab, device, flag_rows=None):
        self.params, self.vocab, self.device = list(params), vocab, device
        rows = len(self.params)
        self.generators = [None] * rows if generators is None else list(generators)  # None: filtering only
        if len(self.generators) != rows:
            raise ValueError(f"{rows} sampling params but {len(self.generators)} generators: give one generator per row.")
        column = lambda values, dtype=torch.float32: _column(values, dtype, device)  # noqa: E731
        self.sampled = [not p.greedy for p in self.params]
        self.has_greedy, self.has_sampled = not all(self.sampled), any(self.sampled)
        self.greedy = column([p.greedy for p in self.params], torch.bool) if self.has_greedy and self.has_sampled else None

        self.penalized = [i for i, p in enumerate(self.params) if p.repetition_penalty != 1]
        if self.penalized:
            if histories is None or len(histories) != rows:
                raise ValueError("a repetition penalty needs each row's history (prompt and output token ids): pass histories, one per row.")
            self.penalty = column([p.repetition_penalty for p in self.params])
            self.seen = _seen_tokens(histories, set(self.penalized), vocab, device)
            self.lengths = [len(histories[i]) for i in self.penalized]

        live = [p for p in self.params if not p.greedy]
        flag_rows = live if flag_rows is None else flag_rows
        self.temperature = None
        if any(p.temperature != 1 for p in live):
            self.temperature = column([p.temperature or 1.0 for p in self.params])
        ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in self.params]  # 0: off
        flagged = [p.top_k for p in flag_rows if 0 < p.top_k < vocab]
        self.top_k = bool(flagged)
        if self.top_k:
            self.kmax = max(flagged)  # topk's size, a Python int from the parameters: no read of k.max()
            self.kth = column([min(k, self.kmax) - 1 if k else self.kmax - 1 for k in ks], torch.long)  # each row's k-th (a greedy row's: any)
            self.k_off = column([k == 0 for k in ks], torch.bool) if any(k == 0 and not p.greedy for k, p in zip(ks, self.params)) else None
        self.top_p = any(p.top_p < 1 for p in flag_rows)
        if self.top_p:  # 1 - p rounded once to float32, as transformers compares it
            self.dropped_mass = column([1 - float(p.top_p) for p in self.params])
        self.min_p = column([p.min_p for p in self.params]) if any(p.min_p > 0 for p in flag_rows) else None

        self.streams, self.used, self.steps, self.last, self.last_on_host = [], [], 0, None, None
        if self.has_sampled and generators is not None:
            self._upload_uniforms()

    def _upload_uniforms(self):
        """Row i's next AHEAD uniforms as float32 [B, AHEAD] clamped to U_MAX, and next [B, 1] = 0. A
        generator shared by several rows gives them its draws in turn, in row order."""
        ranks, users = [], {}
        for g, sampled in zip(self.generators, self.sampled):
            if sampled and g is None:
                raise ValueError(f"row {len(ranks)} samples but has no generator: pass make_generator(seed) for it.")
            ranks.append(users.get(g, 0) if sampled else None)
            if sampled:
                users[g] = ranks[-1] + 1
        self.streams = [(_stream(g), g, count) for g, count in users.items()]
        streams = {g: stream for stream, g, _ in self.streams}
        unused = torch.full((AHEAD,), 0.5, dtype=torch.float64)  # a greedy row's: never looked at
        window = torch.stack([unused if rank is None else streams[g].ahead(g, AHEAD * users[g], rank, users[g])
                              for g, rank in zip(self.generators, ranks)])
        self.uniforms = _to_device(window.float().clamp_(max=U_MAX), self.device)
        self.next = torch.zeros(len(self.params), 1, dtype=torch.long, device=self.device)
        self.used = [stream.used for stream, _, _ in self.streams]

    def continues(self, logits, params, generators, histories):
        """Whether this call is the same rows one token further: the same generators in the same order,
        each having drawn exactly its rows' uniforms since (host counters), the same parameters, each
        penalised row's history exactly one token longer (ending with the token given, where known),
        and uniforms left in the window. Reads no tensor."""
        if (logits.shape[0] != len(self.params) or logits.shape[1] != self.vocab or logits.device != self.device
                or (self.has_sampled and self.steps == AHEAD) or len(generators) != len(self.generators)):
            return False
        if any(a is not b for a, b in zip(generators, self.generators)) or list(params) != self.params:
            return False
        if any(stream.used != used for (stream, _, _), used in zip(self.streams, self.used)):
            return False
        if self.penalized:
            if histories is None or len(histories) != len(self.params):
                return False
            if any(len(histories[i]) != n + 1 for i, n in zip(self.penalized, self.lengths)):
                return False
            if self.last_on_host is not None and any(histories[i][-1] != self.last_on_host[i] for i in self.penalized):
                return False
        return True

    def filtered(self, logits):
        """(the penalised logits, the logits after every processor), both float32 [B, V]: the caller's
        logits themselves where nothing applies, never changed in place. A greedy row is processed as if
        sampled at temperature 1 (its argmax needs only the first)."""
        x = logits.float()
        if self.penalized:
            x = _penalize(x, self.seen, self.penalty)
        penalised = x
        if self.temperature is not None:
            x = x / self.temperature
        if self.top_k:  # keep what is >= the row's k-th largest (ties with it stay); top-k off: everything
            kth = x.topk(self.kmax, dim=1).values.gather(1, self.kth)
            if self.k_off is not None:
                kth = kth.masked_fill(self.k_off, FILTERED)
            x = x.masked_fill(x < kth, FILTERED)
        if self.top_p:  # drop the least likely tokens while together they weigh at most 1 - p
            ascending = x.sort(dim=1).values
            dropped = ascending.softmax(dim=1).cumsum(dim=1) <= self.dropped_mass
            lowest_kept = ascending.masked_fill(dropped, float("inf")).amin(dim=1, keepdim=True)
            lowest_kept = torch.minimum(lowest_kept, ascending[:, -1:])  # the most likely token always stays
            x = x.masked_fill(x < lowest_kept, FILTERED)
        if self.min_p is not None:
            probs = x.softmax(dim=1)
            x = x.masked_fill(probs < self.min_p * probs.amax(dim=1, keepdim=True), FILTERED)
        return penalised, x

    def step(self, logits):
        """Each row's next token, LongTensor [B] on the device: greedy rows their argmax, sampled rows the
        inverse CDF at their next uniform. Launches kernels only; the host learns nothing."""
        if self.last is not None and self.penalized:  # the tokens given last step are in the histories now
            self.seen.scatter_(1, self.last, True)
            self.lengths = [n + 1 for n in self.lengths]
        penalised, x = self.filtered(logits)
        if self.has_sampled:
            # The whole cumulative sum, and the first token whose sum exceeds u x total. u <= U_MAX makes
            # u x total < total (see U_MAX), so the search stops inside the row; a token of probability 0
            # adds exactly 0 to the sum (a sum in order, as on the CPU), so it never exceeds what its
            # predecessor's did not: it is never picked.
            cdf = x.softmax(dim=1).cumsum_(dim=1)  # in place: one [B, V] tensor a step, not two
            u = self.uniforms.gather(1, self.next)
            self.next.add_(1)
            token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
            if self.greedy is not None:
                token = torch.where(self.greedy, penalised.argmax(dim=1, keepdim=True), token)
            for stream, _, count in self.streams:
                stream.used += count
            self.used = [stream.used for stream, _, _ in self.streams]
        else:
            token = penalised.argmax(dim=1, keepdim=True)
        self.steps += 1
        self.last, self.last_on_host = token, None
        return token.view(-1)


# ----------------------------------------------------------------------------------------------
# The functions the engines call

def _rows_match(logits, params):
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(f"logits of shape {tuple(logits.shape)} for {len(params)} sampling params: give logits [B, V] and one SamplingParams per row.")


def filter_logits(logits, params, histories=None):
    """logits [B, V] after each row's processors (repetition penalty, temperature, top-k, top-p, min-p,
    in transformers' order); greedy rows keep only their argmax. Ties with the last token a rule keeps
    are kept. histories: each row's token ids so far, needed when a row sets a repetition penalty."""
    _rows_match(logits, params)
    rows = BatchSampler(params, None, histories, logits.shape[1], logits.device, flag_rows=params)
    penalised, x = rows.filtered(logits)
    if not rows.has_greedy:
        return x.clone() if x is logits else x  # ours, never the caller's
    best = penalised.max(dim=1, keepdim=True)
    argmax_only = torch.full_like(penalised, FILTERED).scatter(1, best.indices, best.values)
    return torch.where(rows.greedy, argmax_only, x) if rows.has_sampled else argmax_only


_local = threading.local()  # each thread's batch state: engines in two threads never share one


def _sample(logits, params, generators, histories):
    _rows_match(logits, params)
    if all(p.greedy and p.repetition_penalty == 1 for p in params):  # nothing to filter, no state: the argmax
        return logits.argmax(dim=1), None
    batch = getattr(_local, "batch", None)
    if batch is None or not batch.continues(logits, params, generators, histories):
        batch = _local.batch = BatchSampler(params, generators, histories, logits.shape[1], logits.device)
    return batch.step(logits), batch


def sample_ids(logits, params, generators, histories=None):
    """The next token of each row of logits [B, V], a LongTensor [B] on logits' device: row i by params[i]
    with generators[i] (a seeded CPU torch.Generator, unused by a greedy row; give it to this sampler
    only), histories[i] its token ids so far (needed where a row sets a repetition penalty). No host
    read: call it again with the same rows, each history one token longer (the token it gave), and it
    reuses its state on the device. That token is trusted here, unread; sample() reads it and checks, so a
    caller that may put another token in a penalised row's history (a constraint, a correction) calls sample()."""
    return _sample(logits, params, generators, histories)[0]


def sample(logits, params, generators, histories=None):
    """sample_ids() as a list of B ints: the step's one host read."""
    tokens, batch = _sample(logits, params, generators, histories)
    tokens = tokens.tolist()
    if batch is not None:
        batch.last_on_host = tokens  # the next call checks that the histories grew by these
    return tokens
