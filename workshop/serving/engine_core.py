"""The engine core: exercise 5's engine in a process of its own, as vLLM runs its EngineCore.

    the server's process                                    the engine's process
    EngineClient.add / abort    ---- commands (a pipe) ---->  EngineCore.run: between steps, add / abort
    its output thread: text,    <--- one message a step ----  step(); each sequence's new token ids
    stop strings, streams

Why a process: a thread would share the server's interpreter lock, and the engine's Python (scheduling,
packing, a small model's many small ops) would wait on the HTTP handlers' Python and they on it. Measured
here on the tiny model, a thread next to the event loop doing 0.4 ms of Python per step made the engine
13% slower with the other core idle. A process of its own has a lock of its own.

The core knows token ids only. Text (incremental detokenizing, stop strings) is the server's: a stop
string found there comes back as an abort of that sequence, and the tokens the core made meanwhile are
dropped. Messages are tuples of plain values, pickled by the pipe:

    to the core     ("add", rid, AddRequest) | ("abort", rid, index or None) | ("stop",)
    from the core   ("ready", limits, state) | ("error", kind, message)     once, at start
                    ("tokens", [(rid, index, new token ids, finished)], state)   after each step
                    ("state", state)                   after commands that changed it while idle
                    ("rejected", rid, message)         the engine refused a request
                    ("failed", message, [rid, ...])    a step raised: those requests are dropped
                    ("dead", message)                  last: a step raised and no new engine could be made:
                                                       every request is dropped
                    ("stopped",)                       last, after ("stop",)

Every request added either gets tokens until each of its sequences is finished, is aborted, or is named
in a "rejected" or "failed" message: none is dropped silently.

A step that raised leaves the engine's state half-updated, and the engine refuses every later call
(workshop/engine_failure.py; vLLM's engine core dies too). The core fails every request in it with the
reason and, as the engine's sentence says, makes a new one for the next requests: a bug that one batch
hits costs that batch, not the server. If no new engine can be made (on a GPU, an error that broke the
device), the core says so ("dead") and ends; the server's /health then answers 503.
"""

import gc
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass, field

import torch

import gpt
from solutions.ex5_paged_kv_cache import Request
from solutions.ex11_cuda_graphs import Engine  # exercise 5's, its decode steps on CUDA graphs where the model is on CUDA
from workshop.serving.overlap import Overlap
from workshop.serving.sampling import GREEDY, SamplingParams

STEP_HISTORY = 1000  # per-step statistics the engine keeps (the counters are kept whole)
COUNTERS = ("aborted", "preemptions", "prefix_queries", "prefix_hits", "generated_tokens", "steps")  # in state(), for ever


class ServingEngine(Overlap, Engine):
    """Exercise 5's engine (through exercise 11's: on CUDA its decode steps replay CUDA graphs, and with overlap scheduling
    the next step is scheduled while one is in flight: workshop/serving/overlap.py) plus what a server needs and the exercise
    does not: abort() takes a sequence out wherever it is (its client left, or a stop string matched) and frees its blocks
    (a token of it still in flight is dropped); vLLM's
    ignore_eos and min_tokens (an end-of-text token that may not end the sequence is kept as a token,
    and the sequence goes on); and nothing is kept once a request is done, since a server runs for ever."""

    num_aborted = 0  # sequences taken out before the engine finished them
    prefix_queries = 0  # prompt tokens looked up in the prefix cache (with prefix caching on)

    def add_request(self, request):
        seqs = super().add_request(request)
        self.sequences.clear()  # offline, the result lists every sequence; here the list would only grow
        if self.enable_prefix_caching:
            self.prefix_queries += len(request.prompt_ids)
        return seqs

    def add_token(self, seq, token, now):
        eos = self.eos_token_id
        if token == eos and (getattr(seq.request, "ignore_eos", False) or len(seq.output_ids) < getattr(seq.request, "min_tokens", 0)):
            self.eos_token_id = None  # this one does not end the sequence
            try:
                return super().add_token(seq, token, now)
            finally:
                self.eos_token_id = eos
        return super().add_token(seq, token, now)

    def abort(self, seq):
        for where in (self.pending, self.waiting, self.running):
            if seq in where:  # Sequence compares by identity
                where.remove(seq)
        if seq.block_table is not None:
            seq.block_table.free(self.allocator)
            seq.block_table = None
        seq.forks = []  # continuations not forked yet: the caller aborts each of them too
        if seq.finished_step < 0:
            seq.finished_step, seq.finish_s = self.step_index, self.clock()
            self.num_aborted += 1

    def step(self):
        super().step()
        self.finished.clear()  # the core reads each sequence's state instead
        for history in (self.stats.batch_sizes, self.stats.scheduled_tokens, self.stats.blocks_in_use, self.stats.tokens_stored):
            if len(history) > 2 * STEP_HISTORY:
                del history[:-STEP_HISTORY]

    @property
    def busy(self):
        return bool(self.pending or self.waiting or self.running or self.in_flight)  # in flight: tokens still to send


@dataclass
class AddRequest:
    """What the core needs of a request: token ids and sampling, no text."""
    prompt_ids: list
    max_tokens: int
    n: int = 1
    sampling: SamplingParams = GREEDY
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass
class EngineOptions:
    """How to build the engine, in the process that runs it (plain values: they cross the pipe)."""
    model: str = "tiny"
    max_batch_size: int = 16
    num_blocks: int | None = None
    device: str | None = None
    enable_prefix_caching: bool = False
    enforce_eager: bool = False  # no CUDA graphs even on CUDA (vLLM's --enforce-eager)


@dataclass
class EngineCore:
    """The loop that owns the engine: takes commands between steps, steps while anything is in it, and
    sends each sequence's new token ids after every step. Blocks on the pipe when idle (no busy loop)."""
    engine: ServingEngine
    requests: dict = field(default_factory=dict)  # rid -> its sequences (None once finished or aborted)
    sent: dict = field(default_factory=dict)  # rid -> tokens already sent, per sequence
    make_engine: object = None  # () -> a new ServingEngine, after a step failed (None: the core cannot go on)
    carried: dict = field(default_factory=dict)  # the COUNTERS of the engines that failed: state() keeps counting up

    @classmethod
    def load(cls, options):
        model = gpt.load_model(options.model, device=options.device)

        def make_engine():
            return ServingEngine(model, options.max_batch_size, num_blocks=options.num_blocks,
                                 enable_prefix_caching=options.enable_prefix_caching,
                                 cuda_graphs=False if options.enforce_eager else None)
        return cls(make_engine(), make_engine=make_engine)

    def limits(self):
        """What the server checks requests against."""
        e, config = self.engine, self.engine.model.config
        return {"num_blocks": e.allocator.num_blocks, "block_size": e.block_size, "max_batch_size": e.max_batch_size,
                "eos_token_id": e.eos_token_id, "n_positions": config.n_positions, "vocab_size": config.vocab_size}

    def state(self):
        e = self.engine
        state = {"running": len(e.running), "waiting": len(e.waiting) + len(e.pending), "free_blocks": e.allocator.num_free_blocks,
                 "num_blocks": e.allocator.num_blocks, "aborted": e.num_aborted, "preemptions": e.stats.preemptions,
                 "prefix_queries": e.prefix_queries, "prefix_hits": e.stats.prefix_hit_tokens,
                 "generated_tokens": e.stats.generated_tokens, "steps": e.stats.steps}
        return {key: value + self.carried.get(key, 0) for key, value in state.items()}

    def run(self, commands, outputs):
        torch.set_num_threads(1)  # per thread: this one runs every forward
        self.engine.start = time.perf_counter()
        try:
            while self._take_commands(commands, outputs):
                if self.engine.busy and not self._step(outputs):
                    return  # the engine failed and no new one could be made: the core is dead, and said so
            outputs.send(("stopped",))
        except (EOFError, OSError):  # the server went away without a word: nothing left to serve
            pass

    def _take_commands(self, commands, outputs):
        """Apply every command waiting; block for one if the engine has nothing to do. False on ("stop",)."""
        changed, wait = False, not self.engine.busy
        while wait or commands.poll():
            command, wait = commands.recv(), False
            if command[0] == "stop":
                return False
            changed = True
            if command[0] == "add":
                self._add(command[1], command[2], outputs)
            elif command[0] == "abort":
                self._abort(command[1], command[2])
        if changed and not self.engine.busy:
            outputs.send(("state", self.state()))
        return True

    def _add(self, rid, add, outputs):
        request = Request(add.prompt_ids, add.max_tokens, arrival_time=self.engine.clock(), n=add.n, sampling=add.sampling)
        request.ignore_eos, request.min_tokens = add.ignore_eos, add.min_tokens  # read by ServingEngine.add_token
        try:
            seqs = self.engine.add_request(request)
        except ValueError as e:  # the server checks first; this is the engine's own word
            outputs.send(("rejected", rid, str(e)))
            return
        self.requests[rid], self.sent[rid] = list(seqs), [0] * len(seqs)

    def _abort(self, rid, index=None):
        seqs = self.requests.get(rid)
        if seqs is None:
            return  # finished meanwhile
        for i, seq in enumerate(seqs):
            if seq is not None and index in (None, i):
                self.engine.abort(seq)
                seqs[i] = None
        if all(seq is None for seq in seqs):
            del self.requests[rid], self.sent[rid]

    def _step(self, outputs):
        """One step, and each sequence's new tokens sent. False when the engine failed and no new one could be made."""
        engine, steps = self.engine, self.engine.stats.steps
        try:
            engine.step()
            engine.step_index += 1
            if engine.stats.steps == steps and not engine.running and (engine.waiting or engine.pending):  # (a step may resolve only)
                raise RuntimeError(f"the engine ran nothing while {len(engine.waiting)} sequences wait")
        except Exception as e:  # noqa: BLE001 (a bug, not the client's fault: fail what is in it, say so, go on with a new engine)
            reason = f"at step {engine.step_index}: {type(e).__name__}: {' '.join(str(e).split())}"  # one line
        else:
            self._send_tokens(outputs)
            return True
        del engine  # (and the error, gone with its except block: its traceback holds the old engine too)
        rids = list(self.requests)
        self.requests.clear(), self.sent.clear()  # their sequences go with the engine: it refuses even an abort now
        if not self._replace_engine(reason, outputs):
            return False
        outputs.send(("state", self.state()))  # the new engine's: empty
        outputs.send(("failed", reason, rids))  # after the new engine is in: a client that retries at once is served
        return True

    def _replace_engine(self, reason, outputs):
        """A new engine in place of the one that failed. False, once ("dead", ...) is sent, if none can be made (the
        requests in the failed one fail with that message)."""
        for key, value in self.state().items():  # the counters so far, the failed engine's included
            if key in COUNTERS:
                self.carried[key] = value
        self.engine = None
        gc.collect()  # the failed engine's KV pool (and graphs) go before the new one's come: never both at once
        try:
            if self.make_engine is None:
                raise RuntimeError("this core was given no way to make a new engine")
            self.engine = self.make_engine()
        except Exception as e:  # noqa: BLE001 (on a GPU, say, an error that broke the device: nothing more can run)
            outputs.send(("dead", f"the engine failed {reason}, and a new one could not be made ({type(e).__name__}: {e})"))
            return False
        self.engine.start = time.perf_counter()
        return True

    def _send_tokens(self, outputs):
        """After a step: each sequence's new tokens, and whether it is finished, in one message."""
        updates = []
        for rid, seqs in list(self.requests.items()):
            sent = self.sent[rid]
            for i, seq in enumerate(seqs):
                if seq is None:
                    continue
                new, finished = seq.output_ids[sent[i]:], seq.finished_step >= 0
                if new or finished:
                    updates.append((rid, i, new, finished))
                    sent[i] += len(new)
                    if finished:
                        seqs[i] = None
            if all(seq is None for seq in seqs):
                del self.requests[rid], self.sent[rid]
        outputs.send(("tokens", updates, self.state()))


def run_in_process(options, commands, outputs):
    """The engine process's body: load the model, say ready (or why not), then serve until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us in order
    try:
        core = EngineCore.load(options)
    except Exception as e:  # noqa: BLE001 (whatever it is, the server must hear it in words)
        outputs.send(("error", type(e).__name__, str(e)))
        return
    outputs.send(("ready", core.limits(), core.state()))
    core.run(commands, outputs)


def start_core(options, in_process=False):
    """Start an engine core. Returns (commands connection, outputs connection, limits, state, the worker,
    the EngineCore or None). in_process: a thread of this process (tests reach into its engine) instead of a
    process of its own. A model that does not load raises here, in this process (gpt.ModelLoadError)."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or locks copied mid-use
    core_commands, commands = context.Pipe(duplex=False)
    outputs, core_outputs = context.Pipe(duplex=False)
    if in_process:
        core = EngineCore.load(options)
        worker = threading.Thread(target=core.run, args=(core_commands, core_outputs), name="engine-core", daemon=True)
        return commands, outputs, core.limits(), core.state(), worker, core
    worker = context.Process(target=run_in_process, args=(options, core_commands, core_outputs), name="engine-core", daemon=True)
    worker.start()
    core_commands.close(), core_outputs.close()  # the child's ends: with them closed here, a dead child reads as EOF
    try:
        message = outputs.recv()
    except EOFError:
        raise RuntimeError(f"The engine process exited (code {worker.exitcode}) before it loaded {options.model!r}.") from None
    if message[0] == "error":
        worker.join()
        raise (gpt.ModelLoadError if message[1] == "ModelLoadError" else ValueError if message[1] == "ValueError" else RuntimeError)(message[2])
    return commands, outputs, message[1], message[2], worker, None
