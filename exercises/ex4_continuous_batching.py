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

Your part: RunningBatch.add and RunningBatch.remove (rows join and leave the batch cache), then
Engine.schedule and Engine.step (the scheduler and one iteration). The rest is given.
Check your work with:  pytest exercises/test_ex4_continuous_batching.py
Stuck? exercises/hints/ex4.md has hints for each part, from the idea to near-code: open one at a time.
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
        # TODO (exercise 4): the newcomers' rows join the batch.
        #   - In: k sequences and their prefill's cache (every layer [k, n_head, T_new, head_dim]) and mask [k, T_new],
        #     itself a left-padded batch. After: self.seqs lists every row, old and new (in any order, the new ones
        #     last say), and keys, values and mask hold every row in the order of self.seqs.
        #   - The contract: decode() then gives every row the token it gets alone. The trap: the two batches have
        #     different widths. Every row stays right-aligned (newest key in the last column), and whatever fills
        #     the gap must be hidden from attention.
        raise NotImplementedError("Exercise 4: implement RunningBatch.add() in exercises/ex4_continuous_batching.py "
                                  "(left-pad the shorter batch, then concatenate rows: keys, values, mask, seqs).")

    def remove(self, done):
        """Cut out the rows of the sequences in `done`, then the leading columns that have become
        padding in every remaining row (a long request left: the others do not need its width)."""
        # TODO (exercise 4): the rows of the sequences in `done` leave the batch.
        #   - The rows left keep their own keys, values and mask, in the same order as in self.seqs.
        #   - Memory: what the batch holds must not grow with the work it serves. Over hundreds of steps of
        #     requests joining and leaving, its bytes stay within what the busiest moments needed. The trap: a
        #     long row that leaves leaves its width behind, as padding in every row left, and each step adds a
        #     column. (Keeping a capacity and reusing it, as real engines keep their KV pool, is fine.)
        raise NotImplementedError("Exercise 4: implement RunningBatch.remove() in exercises/ex4_continuous_batching.py "
                                  "(drop the finished rows, then the leading columns that are padding in every row left).")

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
            # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
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
        # TODO (exercise 4): once per step, before the model runs.
        #   - Arrivals: a pending sequence whose request has arrived (its arrival_step has come, and its
        #     arrival_time on self.clock()) moves from self.pending to the waiting queue. Its arrival_s is when
        #     it arrived: request.arrival_time for a request that comes by the clock; for one scripted to arrive
        #     at a later step, the clock as that step's scheduling starts.
        #   - Admission: first come, first served by arrival_s, also among requests that arrived during the same
        #     step (at the same arrival_s, in submission order), while a slot is free. An admitted sequence gets a
        #     slot no running sequence holds (0 to max_batch_size - 1), and admitted_step = this step.
        #   - Returns the admitted sequences, in the order admitted.
        raise NotImplementedError("Exercise 4: implement Engine.schedule() in exercises/ex4_continuous_batching.py "
                                  "(arrived requests join the waiting queue; waiting ones take free slots, first come first served).")

    @dies_on_error  # given: a step that raised marks the engine failed, and every later call raises EngineFailed (workshop/engine_failure.py)
    def step(self):
        """One iteration: admit, prefill the admitted, decode everyone else, retire the finished."""
        # TODO (exercise 4): one iteration, with the pieces above (schedule, prefill, self.running).
        #   - Every sequence running at this step gets exactly one token: a newcomer the first token of its
        #     prefill, everyone already running one decode step. Nobody running or admitted: no step at all.
        #   - Timeline: first_token_s is the clock at a sequence's FIRST token. A sequence ends right after its
        #     eos_token_id (a generated one: an EOS inside the prompt is just text) or its max_new_tokens-th
        #     token; then record finished_step and finish_s, add it to self.finished, and its slot is free again.
        #   - The finished leave the running batch in this same step: not one forward more for them.
        #   - Count the step in self.stats: steps, generated_tokens, and batch_sizes (tokens this step produced).
        raise NotImplementedError("Exercise 4: implement Engine.step() in exercises/ex4_continuous_batching.py "
                                  "(admit, prefill the admitted, decode the running batch, retire the finished).")

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
