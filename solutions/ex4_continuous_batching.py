"""Exercise 4: continuous batching (iteration-level scheduling, as in Orca, OSDI 2022).

Static batching (exercise 3) decides who runs together once per batch: a row that finished early sits
idle until the longest row is done, and a request that arrives meanwhile waits for the whole batch.
Continuous batching decides it at EVERY step (iteration) of the engine:

    while there is work:
        schedule: requests that arrived join the waiting queue; waiting ones take the free slots
        run the model: the newly admitted get their prefill (-> first token), every other running
                       request decodes one token, all in the same iteration
        retire: the finished leave at once, and their slots are free for the next iteration

So every running request gets exactly one token per step, and no slot stays idle while someone waits.
(A step with newcomers makes two forward passes here, their prefill and everyone else's decode; Orca
fuses them into one, "selective batching". Two keep the code plain.)

The pieces, as in a real engine (vLLM, nano-vllm):
  Request       what a client submits: prompt, max_new_tokens, when it arrives
  Sequence      a request inside the engine: its tokens, its slot, its timestamps (TTFT, TPOT, ...)
  RunningBatch  the KV caches of the running sequences, kept as ONE left-padded batch (exercise 3's
                layout): new rows join right-aligned, finished rows are cut out
  Engine        the scheduler (waiting queue, max_batch_size) and the loop

Requests of different lengths share one decode forward because the batch cache is left-padded with
an attention mask, exactly as in exercise 3; rows just come and go. (The padding it needs is waste
of another kind: exercise 5's paged KV cache removes it.)
"""

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from gpt import EOS_TOKEN_ID, check_request
from solutions.ex2_kv_cache import KVCache, forward  # references, never the student's earlier exercises
from solutions.ex3_static_batching import left_pad
from workshop.engine_failure import dies_on_error, refused_when_dead  # given: a step that raised kills the engine
from workshop.serving.sampling import GREEDY, SamplingParams, make_generator, sample  # given code, not exercise 6's answer


@dataclass
class Request:
    """What a client submits. Use one way of arriving: arrival_step for scripted tests (the request
    joins the waiting queue at the start of that engine step), arrival_time for real traffic
    (seconds after the engine starts, e.g. Poisson arrivals)."""
    prompt_ids: list
    max_new_tokens: int
    arrival_step: int = 0
    arrival_time: float = 0.0
    sampling: SamplingParams = GREEDY  # how its tokens are chosen (exercise 6 explains it): greedy unless asked


@dataclass(eq=False)  # two sequences are the same only if they are the same object
class Sequence:
    """A request inside the engine: its output so far, the slot it runs in, and its timeline.
    Times are seconds since the engine started; steps count the engine's iterations."""
    id: int  # the request's index in the submitted list
    request: "Request"
    output_ids: list = field(default_factory=list)
    slot: int = -1  # which of the max_batch_size slots it runs in
    admitted_step: int = -1  # the step of its prefill, which gives its first token
    finished_step: int = -1  # the step that gave its last token
    arrival_s: float = 0.0
    first_token_s: float = 0.0
    finish_s: float = 0.0
    generator: torch.Generator = None  # its own random numbers, seeded by request.sampling.seed

    @property
    def ttft(self):
        """Time to first token: waiting in the queue plus the prefill."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot(self):
        """Time per output token after the first (0 for a one-token answer)."""
        n = len(self.output_ids)
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else 0.0

    @property
    def latency(self):
        """End-to-end latency: arrival to last token."""
        return self.finish_s - self.arrival_s


@dataclass
class EngineStats:
    max_batch_size: int
    steps: int = 0  # iterations that ran the model
    generated_tokens: int = 0
    elapsed_s: float = 0.0  # wall clock from start to the last request's end
    batch_sizes: list = field(default_factory=list)  # running sequences at each step

    @property
    def throughput(self):
        """Generated tokens per second."""
        return self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def occupancy(self):
        """Average fraction of the max_batch_size slots producing a token at a step."""
        return self.generated_tokens / (self.steps * self.max_batch_size) if self.steps else 0.0


@dataclass
class EngineResult:
    sequences: list  # one Sequence per request, in the order submitted: outputs and metrics
    stats: "EngineStats"
    finish_order: list  # request ids in the order they finished

    @property
    def outputs(self):
        return [seq.output_ids for seq in self.sequences]


# ----------------------------------------------------------------------------------------------
# The model side: prefill the newcomers, decode the running batch

def next_tokens(logits, seqs):
    """Each sequence's next token from its row of logits [len(seqs), vocab], chosen by its request's
    sampling parameters with its own generator (workshop.serving.sampling, given): greedy and sampled requests
    share the batch, and a seeded request gets the same tokens whoever it runs with."""
    return sample(logits, [seq.request.sampling for seq in seqs], [seq.generator for seq in seqs],
                  [seq.request.prompt_ids + seq.output_ids for seq in seqs])


@torch.no_grad()
def prefill(model, seqs):
    """Run the prompts of `seqs` as one left-padded batch. Returns each one's first token, and the
    KV cache and attention mask of that batch, ready to join the running batch."""
    input_ids, mask, position_ids = left_pad([seq.request.prompt_ids for seq in seqs], device=model.device)
    kv_cache = KVCache(model.config.n_layer)
    logits = forward(model, input_ids, position_ids, kv_cache, mask)
    return next_tokens(logits[:, -1], seqs), kv_cache, mask


class RunningBatch:
    """The KV caches of the running sequences as ONE left-padded batch: every layer's keys and
    values are [B, n_head, T, head_dim], `mask` [B, T] is False at padding, and row i belongs to
    seqs[i]. Rows are right-aligned: each row's newest token is in the last column."""

    def __init__(self, n_layer, device):
        self.seqs = []
        self.kv_cache = KVCache(n_layer)
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=device)

    def __len__(self):
        return len(self.seqs)

    def add(self, seqs, kv_cache, mask):
        """Append the rows of a prefilled batch (seqs, its KV cache and mask). The shorter of the two
        batches is left-padded, so that all right edges line up."""
        if not self.seqs:  # an empty batch simply becomes the newcomers
            self.kv_cache.keys, self.kv_cache.values = list(kv_cache.keys), list(kv_cache.values)
            self.seqs, self.mask = list(seqs), mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for layer in range(len(self.kv_cache.keys)):
            self.kv_cache.keys[layer] = torch.cat([_pad_left(self.kv_cache.keys[layer], width), _pad_left(kv_cache.keys[layer], width)])
            self.kv_cache.values[layer] = torch.cat([_pad_left(self.kv_cache.values[layer], width), _pad_left(kv_cache.values[layer], width)])
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.seqs = self.seqs + list(seqs)

    def remove(self, done):
        """Cut out the rows of the sequences in `done`, then the leading columns that have become
        padding in every remaining row (a long request left: the others do not need its width)."""
        keep = [row for row, seq in enumerate(self.seqs) if seq not in done]
        if len(keep) == len(self.seqs):
            return
        self.seqs = [self.seqs[row] for row in keep]
        rows = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        used = self.mask[rows].any(dim=0)
        start = int(used.nonzero()[0]) if len(keep) else self.mask.shape[1]  # first column someone uses
        self.mask = self.mask[rows, start:]
        for layer in range(len(self.kv_cache.keys)):
            self.kv_cache.keys[layer] = self.kv_cache.keys[layer][rows, :, start:]
            self.kv_cache.values[layer] = self.kv_cache.values[layer][rows, :, start:]

    @torch.no_grad()
    def decode(self, model):
        """One forward for the whole batch: each row's newest token at its own next position.
        Returns the next token of every row."""
        input_ids = torch.tensor([[seq.output_ids[-1]] for seq in self.seqs], device=self.mask.device)
        position_ids = torch.tensor([[len(seq.request.prompt_ids) + len(seq.output_ids) - 1] for seq in self.seqs],
                                    device=self.mask.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.seqs), 1)], dim=1)
        logits = forward(model, input_ids, position_ids, self.kv_cache, self.mask)
        return next_tokens(logits[:, -1], self.seqs)


def _pad_left(t, width):
    """Zero-pad (False-pad, for the mask) dimension -2 of a cache [B, H, T, D] or dim 1 of a mask [B, T] on the left up to `width`."""
    time_dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[time_dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[time_dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=time_dim)


# ----------------------------------------------------------------------------------------------
# The engine: scheduler and loop

class Engine:
    def __init__(self, model, max_batch_size, eos_token_id=EOS_TOKEN_ID):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size is {max_batch_size}: the running batch must hold at least 1 request.")
        self.model, self.max_batch_size, self.eos_token_id = model, max_batch_size, eos_token_id
        self.sequences = []  # every request submitted, in order
        self.pending = []  # submitted, not arrived yet
        self.waiting = deque()  # arrived, waiting for a slot: first come, first served
        self.running = RunningBatch(model.config.n_layer, model.device)
        self.free_slots = list(range(max_batch_size))
        self.finished = []  # in the order they finished
        self.step_index = 0
        self.stats = EngineStats(max_batch_size)
        self.start = None

    def clock(self):
        """Seconds since the engine started."""
        return time.perf_counter() - self.start

    @refused_when_dead
    def add_request(self, request):
        """Submit a request; rejects one that cannot run, before any work starts."""
        try:
            check_request(request.prompt_ids, request.max_new_tokens, self.model.config.n_positions, self.model.config.vocab_size)
        except ValueError as e:
            raise type(e)(f"Request {len(self.sequences)}: {e}") from None  # the same class: InvalidIndex stays an IndexError too
        seq = Sequence(id=len(self.sequences), request=request, generator=make_generator(request.sampling.seed))
        self.sequences.append(seq)
        self.pending.append(seq)
        return seq

    def schedule(self):
        """The scheduler, once per step: requests that have arrived join the waiting queue, then
        waiting requests take free slots, first come first served. Returns the admitted sequences."""
        now = self.clock()
        arrived = [s for s in self.pending if s.request.arrival_step <= self.step_index and s.request.arrival_time <= now]
        for seq in arrived:
            self.pending.remove(seq)
            seq.arrival_s = seq.request.arrival_time if seq.request.arrival_step == 0 else max(seq.request.arrival_time, now)
        # in the order they arrived, even within one step (0.12 s before 0.14 s); at the same time, as submitted
        self.waiting.extend(sorted(arrived, key=lambda seq: (seq.arrival_s, seq.id)))
        admitted = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot, seq.admitted_step = self.free_slots.pop(0), self.step_index
            admitted.append(seq)
        return admitted

    @dies_on_error  # given: a step that raised marks the engine failed, and every later call raises EngineFailed (workshop/engine_failure.py)
    def step(self):
        """One iteration: admit, prefill the admitted, decode everyone else, retire the finished."""
        admitted = self.schedule()
        decoding = list(self.running.seqs)
        if not admitted and not decoding:
            return  # nothing has arrived yet
        next_tokens = self.running.decode(self.model) if decoding else []
        if admitted:
            first_tokens, kv_cache, mask = prefill(self.model, admitted)
            self.running.add(admitted, kv_cache, mask)
            next_tokens += first_tokens
        now = self.clock()
        for seq, token in zip(decoding + admitted, next_tokens):
            seq.output_ids.append(token)
            if len(seq.output_ids) == 1:
                seq.first_token_s = now
            if token == self.eos_token_id or len(seq.output_ids) == seq.request.max_new_tokens:
                seq.finished_step, seq.finish_s = self.step_index, now
                self.finished.append(seq)
                self.free_slots.append(seq.slot)
        self.running.remove({seq for seq in decoding + admitted if seq.finished_step >= 0})
        self.free_slots.sort()  # reuse the lowest free slot: a tidy timeline picture
        self.stats.steps += 1
        self.stats.generated_tokens += len(next_tokens)
        self.stats.batch_sizes.append(len(next_tokens))

    def wait_for_next_arrival(self):
        """Nothing is running or waiting: jump to the next arrival (an idle engine does no steps)."""
        first = min(self.pending, key=lambda s: (s.request.arrival_step, s.request.arrival_time))
        self.step_index = max(self.step_index, first.request.arrival_step)
        time.sleep(max(0.0, first.request.arrival_time - self.clock()))

    @refused_when_dead
    def run(self, requests):
        """Serve `requests` (a list of Request) until every one has finished."""
        for request in requests:  # every request is checked before any work starts
            self.add_request(request)
        self.start = time.perf_counter()
        while self.pending or self.waiting or self.running.seqs:
            if not self.waiting and not self.running.seqs:
                self.wait_for_next_arrival()
            steps_before = self.stats.steps
            self.step()
            if self.stats.steps == steps_before and self.waiting:  # an engine that never ends: say why
                waiting = f"{len(self.waiting)} request{'s wait' if len(self.waiting) != 1 else ' waits'}"
                taken = self.max_batch_size - len(self.free_slots)
                if taken and not self.running.seqs:
                    slots = "its only slot is" if self.max_batch_size == 1 else f"{taken} of its {self.max_batch_size} slots are"
                    raise RuntimeError(f"step {self.step_index} ran nothing while {waiting}: no request is running, yet {slots} "
                                       f"still taken. Engine.step must give a finished request's slot back (to free_slots).")
                raise RuntimeError(f"step {self.step_index} ran nothing while {waiting}: Engine.schedule must admit waiting "
                                   f"requests into free slots, and Engine.step must count each step it runs.")
            self.step_index += 1
        self.stats.elapsed_s = self.clock()
        return EngineResult(self.sequences, self.stats, [seq.id for seq in self.finished])


def generate(model, requests, max_batch_size, eos_token_id=EOS_TOKEN_ID):
    """Serve requests with continuous batching. requests: a list of Request. Returns an
    EngineResult: a Sequence per request (in the order given: .output_ids, .ttft, .tpot, .latency)
    and the engine's totals (.stats.throughput, .steps, .occupancy)."""
    return Engine(model, max_batch_size, eos_token_id).run(requests)
