"""The server's side of the engine core (engine_core.py: the engine in a process of its own). The event loop
adds and aborts requests; an output thread reads each step's new token ids, turns them into text through
each choice's stop checker, counts them in the metrics, and hands every request's new text of the step to
its event loop at once.

    Generation     one HTTP request inside the engine: its stop checkers, and what has reached it so far
    EngineClient   add / abort, the output thread, and a reason for every request that fails
"""

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from workshop.serving.engine_core import start_core
from workshop.serving.protocol import APIError

log = logging.getLogger("workshop.serving.server")  # the server's log: one name for all its lines


@dataclass
class Output:
    index: int  # which of the request's n choices
    text: str  # new text, safe to show
    finish_reason: str | None  # None while it runs, then "stop" or "length"
    num_tokens: int = 0  # the choice's tokens so far (continuous usage stats)


class Generation:
    """One HTTP request inside the engine: its prompt, a stop checker per continuation, and what the
    output thread has handed it so far (`items`: Output items, then None when all are done, or an
    APIError), with an event that wakes its handler. The output thread hands over every request's items
    of a step at once (deliver(), one call_soon_threadsafe per step, not one per token); the handler
    takes all that has arrived at once (take()), so a loop that falls behind sends fewer, larger writes."""

    def __init__(self, prompt_ids, checkers):
        self.prompt_ids, self.checkers = prompt_ids, checkers
        self.rid = None  # the engine core's id for it, once added
        self.arrival = time.perf_counter()  # for the latency metrics
        self.last_token = [None] * len(checkers)  # when each choice's last token reached it
        self.loop, self.items, self.ready = asyncio.get_running_loop(), [], asyncio.Event()
        self.done = False  # set by the output thread when it has handed over the last item

    def put(self, item):
        """On the event loop: one item in."""
        self.items.append(item)
        self.ready.set()

    async def take(self):
        """On the event loop: every item handed over so far (waits for at least one)."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        items, self.items = self.items, []
        return items

    def send(self, item):
        """From any thread: hand one item to the request's event loop."""
        deliver([(self, item)])

    def finish(self, error=None):
        self.done = True
        self.send(error)

    def usage(self, completion=None):
        prompt = len(self.prompt_ids)
        completion = sum(len(c.token_ids) for c in self.checkers) if completion is None else completion
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def deliver(batch):
    """From the output thread: hand (generation, item) pairs to their event loops, in order, with one
    call_soon_threadsafe per loop (each call writes to the loop's wake-up socket: a system call)."""
    loops = {}
    for generation, item in batch:
        loops.setdefault(generation.loop, []).append((generation, item))
    for loop, pairs in loops.items():
        try:
            loop.call_soon_threadsafe(_put_all, pairs)
        except RuntimeError:  # the event loop is closed: the server is gone, nobody is listening
            pass


def _put_all(pairs):
    for generation, item in pairs:
        generation.put(item)


class EngineClient:
    """The server's side of the engine core (workshop/serving/engine_core.py: the engine in a process of
    its own). add() and abort() send commands from the event loop; an output thread reads what each step
    made, turns each choice's token ids into text through its stop checker, and hands every request's
    items of the step to the event loop at once (deliver()). A stop string found here aborts that
    sequence in the core. Every request either finishes or fails with a reason: rejected by the engine,
    a step that raised (500 for the requests in the engine; the core goes on with a new engine), or the
    engine gone: its process exited, or it failed and no new one could be made (500, and /health says 503)."""

    def __init__(self, options, tokenizer, metrics=None, in_process=False):
        self.commands, self.outputs, self.limits, self.state, self.worker, self.core = start_core(options, in_process)
        self.tokenizer, self.metrics = tokenizer, metrics  # the output thread's own tokenizer
        self.active = {}  # rid -> Generation: the requests in the engine
        # both threads end sequences (the output thread: stop or length; the event loop: a client that left): under this lock a
        # request leaves self.active once, and each of its sequences is counted as ended once
        self.ending = threading.Lock()
        self.next_rid, self.lock = 0, threading.Lock()  # the lock: both threads send commands
        self.closed = False  # set by the output thread when the core is gone, before it fails what is in flight
        self.death = None  # why the core is gone, when it said why (a failed engine no new one could replace)
        self.reader = threading.Thread(target=self._read, name="engine-outputs", daemon=True)

    def start(self):
        if self.core is not None:  # in this process: a thread
            self.worker.start()
        self.reader.start()

    @property
    def alive(self):
        return not self.closed and self.worker.is_alive() and self.reader.is_alive()

    def add(self, generation, request):
        """On the event loop: hand a request (an engine_core.AddRequest) to the core."""
        generation.rid, self.next_rid = self.next_rid, self.next_rid + 1
        self.active[generation.rid] = generation  # first: if the core dies after this, the output thread fails it
        if not self.alive:
            self.active.pop(generation.rid, None)
            why = f" ({self.death})" if self.death else ""
            raise APIError(f"The engine is not running{why}: retry on another server.", status=503, type="server_error")
        self._send(("add", generation.rid, request))
        if self.metrics:  # the prompt once per sequence, as each of vLLM's child requests counts it
            self.metrics.prompt_tokens.labels(**self.metrics.labels).inc(len(request.prompt_ids) * request.n)

    def abort(self, generation):
        """On the event loop: the client left; free its sequences in the core (each unfinished one ends as "abort")."""
        with self.ending:
            if self.active.pop(generation.rid, None) is None:
                return
            self._end_unfinished(generation, "abort")
        self._send(("abort", generation.rid, None))
        generation.finish(APIError("The client closed the connection: its request was aborted.", status=499))

    def shutdown(self, timeout=10):
        self._send(("stop",))
        self.reader.join(timeout)
        self.worker.join(timeout)
        if self.core is None and self.worker.is_alive():
            self.worker.terminate()
        self._fail_all(APIError("The server is shutting down: retry on another one.", status=503, type="server_error"), "abort")

    def _send(self, command):
        try:
            with self.lock:
                self.commands.send(command)
        except OSError:  # the core is gone: the output thread fails what is in flight
            pass

    def _read(self):
        error, reason = APIError("The server is shutting down: retry on another one.", status=503, type="server_error"), "abort"
        while True:
            try:
                message = self.outputs.recv()
            except (EOFError, OSError):
                log.error("the engine process exited")
                error = APIError("The engine process exited; the request was dropped: retry it.", status=500, type="server_error")
                reason = "error"
                break
            kind = message[0]
            if kind == "tokens":
                self.state = message[2]
                self._publish(message[1])
            elif kind == "state":
                self.state = message[1]
            elif kind == "rejected":  # the server checks first; this is the engine's own word
                self._fail([message[1]], APIError(message[2]))
            elif kind == "failed":  # a bug, not the client's fault: the core goes on with a new engine
                log.error("engine step failed %s; a new engine takes the next requests", message[1])
                self._fail(message[2], APIError(f"The engine failed {message[1]}; the request was dropped, retry it.",
                                                status=500, type="server_error"))
            elif kind == "dead":  # it failed and could not be replaced: nothing more will be served
                log.error("%s; the server cannot serve any more", message[1])
                self.death = message[1]
                error = APIError(f"The engine is dead ({message[1]}); the request was dropped: retry on another server.",
                                 status=500, type="server_error")
                reason = "error"
                break
            elif kind == "stopped":
                break
        self.closed = True
        self._fail_all(error, reason)

    def _publish(self, updates):
        """After a step: each sequence's new tokens through its stop checker, the text to its request; every
        request's items of the step handed to the event loop at once."""
        now, metrics, batch, ended, stopped = time.perf_counter(), self.metrics, [], [], []
        with self.ending:  # a request the event loop aborts leaves before or after this step's tokens, not during
            for rid, index, tokens, engine_finished in updates:
                generation = self.active.get(rid)
                if generation is None:
                    continue  # its client left
                checker = generation.checkers[index]
                if checker.finished:
                    continue  # a stop string ended it: tokens made before the core heard
                pieces, before = [], len(checker.token_ids)
                for token in tokens:
                    pieces.append(checker.add(token))
                    if checker.finished:
                        break
                if checker.finished and not engine_finished:
                    stopped.append(("abort", rid, index))  # a stop string: stop computing it, free its blocks now
                if pieces and (pieces != [""] or checker.finished):
                    batch.append((generation, Output(index, "".join(pieces), checker.finish_reason, len(checker.token_ids))))
                if metrics and pieces:
                    self._count(generation, index, len(checker.token_ids) - before, now)
                if checker.finished:
                    ended.append(rid)
                    if metrics:
                        self._count_end(generation, checker.finish_reason, now)
            for rid in ended:
                generation = self.active.get(rid)
                if generation is not None and all(c.finished for c in generation.checkers) and self.active.pop(rid, None):
                    generation.done = True
                    batch.append((generation, None))
        for command in stopped:
            self._send(command)
        if batch:
            deliver(batch)

    def _count(self, generation, index, new_tokens, now):
        """A sequence's new tokens: its first step's is a TTFT sample, each later step's an inter-token one."""
        metrics, labels = self.metrics, self.metrics.labels
        metrics.generation_tokens.labels(**labels).inc(new_tokens)
        last = generation.last_token[index]
        if last is None:
            metrics.ttft.labels(**labels).observe(now - generation.arrival)
        else:
            metrics.itl.labels(**labels).observe(now - last)
        generation.last_token[index] = now

    def _count_end(self, generation, reason, now):
        """A sequence ended (once each, under self.ending): a finished request by reason, and its end-to-end time."""
        metrics, labels = self.metrics, self.metrics.labels
        metrics.success.labels(finished_reason=reason, **labels).inc()
        metrics.e2e.labels(**labels).observe(now - generation.arrival)

    def _end_unfinished(self, generation, reason):
        """Under self.ending, the request just taken out of self.active: each sequence not finished yet ends as `reason`."""
        if self.metrics:
            now = time.perf_counter()
            for checker in generation.checkers:
                if not checker.finished:
                    self._count_end(generation, reason, now)

    def _fail(self, rids, error, reason="error"):
        for rid in rids:
            with self.ending:
                generation = self.active.pop(rid, None)
                if generation is not None:
                    self._end_unfinished(generation, reason)
            if generation is not None:
                generation.finish(error)

    def _fail_all(self, error, reason):
        self._fail(list(self.active), error, reason)
