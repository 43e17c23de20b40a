"""An OpenAI-compatible HTTP server in front of the workshop's paged engine (exercise 5's reference).

    this process                                                  the engine's process (engine_core.py)
    HTTP handlers (asyncio, uvicorn): validate, tokenize  -- add / abort (a pipe) -->  EngineCore: steps
    output thread: token ids -> text, stop strings        <-- new token ids a step --  continuously
    SSE chunks or one response  <-- one hand-off a step --

The engine runs continuously in a process of its own (as vLLM runs its EngineCore: the server's Python
and the engine's never wait on one interpreter lock): requests join and leave its batch at every step
(continuous batching), and each step's new token ids come back at once. Here an output thread turns
them into text through each choice's stop checker and hands every request's new text of the step to
the event loop at once (one call_soon_threadsafe per step: a per-token hand-off costs a wake-up system
call each), so a streaming client sees its first token after one step (real TTFT), not the whole
answer at the end. A handler writes all that reached it since its last write as one piece, each
choice's text merged (as vLLM does for a client that falls behind). Every request either finishes or
fails with a reason: none is dropped.

    POST /v1/completions        prompt: a string or a list of token ids
    POST /v1/chat/completions   messages, through a plain "User: ... / Assistant:" template
    GET  /v1/models, /health

    GET  /metrics               Prometheus text format, vLLM's metric names (prometheus_client)

Parameters: max_tokens, temperature, top_p, stop, seed, n, stream (+ stream_options.include_usage and
vLLM's continuous_usage_stats: usage in every chunk), and vLLM's extensions top_k, min_p,
repetition_penalty, ignore_eos, min_tokens. OpenAI's parameters this server cannot honour (logprobs,
echo, best_of, penalties, tools, ...) get a 400 that says so; a field nobody here knows is ignored
with one warning line in the log, as vLLM does. Types are strict (max_tokens "10" or true is a 400).

Nothing a request does stalls the others: its text is tokenized in a thread pool, not on the event
loop; the body (MAX_BODY_BYTES), a text prompt (longer than any prompt that fits the context) and the
stop list (MAX_STOP_STRINGS of at most MAX_STOP_LENGTH characters) are bounded, refused with a 413 or
400 that names the limit; and stop matching costs the same per token whatever the number of stop
strings (it looks only at the text's tail, against sets). Start it with `python serve.py`.
"""

import asyncio
import gc
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.exceptions import HTTPException

import gpt
from gpt import EOS_TOKEN_ID, check_request
from workshop.serving.engine_core import AddRequest, EngineOptions, start_core
from workshop.serving.sampling import SamplingParams

log = logging.getLogger("workshop.serving.server")

CHAT_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOP = "\nUser:"  # a base model happily writes the user's next turn too: the end of the assistant's
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request asks whether its client is still there
MAX_BODY_BYTES = 1 << 20  # a request body over 1 MiB gets a 413 (a full context of token ids is a few kB)
MAX_STOP_STRINGS = 64  # OpenAI allows 4; vLLM no limit: a bound keeps one request from slowing every step
MAX_STOP_LENGTH = 128  # characters per stop string: the tail the stop matcher looks at per token
TOKENIZER_THREADS = 2  # the pool that tokenizes prompts off the event loop


# ----------------------------------------------------------------------------------------------
# Text: incremental detokenization with exercise 6's stop rules

class IncrementalStopChecker:
    """Exercise 6's StopChecker rules, token for token (stop token, stop strings across tokens, text held
    back while it may still become a stop string or ends in half a UTF-8 character), at a cost per token
    that grows with neither the output's length nor the number of stop strings: add() decodes only the
    last few tokens (vLLM's incremental detokenizer), a stop string is looked for only among the
    substrings that end in the new text (one set lookup per distinct stop length), and the text held back
    is found by looking the tail (at most the longest stop string) up in the set of every stop string's
    prefixes.

    vLLM's extensions: special_ids (the end-of-text token) make no text; a special id that is not a stop
    token (ignore_eos) is just counted; min_tokens: neither stop tokens nor stop strings end the request
    before it has that many tokens."""

    def __init__(self, tokenizer, stop=(), stop_token_ids=(EOS_TOKEN_ID,), max_new_tokens=None, min_tokens=0,
                 special_ids=(EOS_TOKEN_ID,)):
        stop = [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}: remove the empty ones.")
        self.tokenizer, self.stop, self.stop_token_ids = tokenizer, stop, set(stop_token_ids)
        self.special_ids = set(special_ids) | self.stop_token_ids
        self.max_new_tokens, self.min_tokens = max_new_tokens, min_tokens
        self.stop_set = set(stop)
        self.lengths = sorted({len(s) for s in stop})
        self.longest = self.lengths[-1] if stop else 0
        self.prefixes = {s[:i] for s in self.stop_set for i in range(1, len(s) + 1)}
        self.token_ids = []  # every new token, the stopping one included
        self.text_ids = []  # the tokens that make text: all but special ones
        self.text = ""  # the final text once finished; the text so far before that
        self.sent = 0  # characters of text already returned by add()
        self.finish_reason = None  # "stop" (stop token or stop string) or "length" (max_new_tokens)
        self.done = ""  # the text of text_ids[:read], which ends in a whole character: it never changes
        self.prefix = self.read = 0  # decoding restarts at text_ids[prefix], a token boundary a little before read

    @property
    def finished(self):
        return self.finish_reason is not None

    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
        self.token_ids.append(token)
        count = len(self.token_ids)
        if token in self.stop_token_ids and count > self.min_tokens:
            self.finish_reason = "stop"
        else:
            if token not in self.special_ids:
                self.text_ids.append(token)
                searched = len(self.done)  # the text so far had no stop string: a new one ends after this
                self._decode()
                cut = self._find_stop(searched) if self.stop and count >= self.min_tokens else None
                if cut is not None:
                    self.text, self.finish_reason = self.text[:cut], "stop"
            if not self.finished and self.max_new_tokens is not None and count >= self.max_new_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finished else self._safe_length()
        piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return piece

    def _decode(self):
        """self.text = the decoded text (vLLM's incremental detokenizer: decode from a token boundary a
        little before the new tokens, keep what they added). Once it ends in a whole character, it is done."""
        start = len(self.tokenizer.decode(self.text_ids[self.prefix:self.read]))
        new = self.tokenizer.decode(self.text_ids[self.prefix:])[start:]
        if new and not new.endswith("\ufffd"):  # U+FFFD at the end: half a character, more bytes to come
            self.done += new
            self.prefix, self.read, new = self.read, len(self.text_ids), ""
        self.text = self.done + new  # a copy, not a decode

    def _find_stop(self, searched):
        """Where the earliest stop string that ends after text[:searched] starts, or None."""
        text, best = self.text, None
        for end in range(searched + 1, len(text) + 1):
            for length in self.lengths:
                start = end - length
                if start < 0:
                    break
                if (best is None or start < best) and text[start:end] in self.stop_set:
                    best = start
        return best

    def _safe_length(self):
        """Up to half a character at the end, and up to the earliest suffix that begins a stop string."""
        text = self.text
        end = len(text) - text.endswith("\ufffd")
        for start in range(max(0, end - self.longest + 1), end):
            if text[start:end] in self.prefixes:
                return start
        return end


# ----------------------------------------------------------------------------------------------
# Metrics: Prometheus, vLLM's names

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's: a stop token or string, max_tokens, the client left, the engine failed
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app), under vLLM's names: the
    engine's state is read when scraped (requests running and waiting, KV-cache usage, preemptions,
    prefix-cache queries and hits: the core's numbers after its last step), the rest is counted as tokens
    reach their requests (prompt and generation tokens, finished requests by reason, TTFT, inter-token and
    end-to-end latency).

    Every one counts the same unit: a sequence, one of a request's n choices (vLLM's v1 engine runs a
    request with n > 1 as n child requests, and its metrics count the children). A sequence adds its
    prompt's length when it is added; one TTFT sample with its first token, one inter-token sample per later
    step that gives it tokens; when it ends, one request_success (stop, length, abort: its client left or the
    server shut down, error: the engine failed) and one end-to-end sample. So request_success and the
    end-to-end count agree with the sequences added once they have ended, whatever ended them."""

    def __init__(self, engine_state, model_name):
        self.registry, self.engine_state, self.labels = CollectorRegistry(), engine_state, {"model_name": model_name}
        names = ["model_name"]
        self.registry.register(self)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of the sequences added (a request's prompt once per choice).",
                                     names, registry=self.registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated and sent to requests.", names, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished sequences, by finish reason.", names + ["finished_reason"],
                               registry=self.registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from a request's arrival to a sequence's first token.", names,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", names,
                             buckets=TOKEN_BUCKETS, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from a request's arrival to a sequence's end (its last token, "
                             "or its abort).", names,
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        for metric in (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e):  # at 0 from the start, as vLLM's
            metric.labels(**self.labels)
        for reason in FINISH_REASONS:
            self.success.labels(finished_reason=reason, **self.labels)

    def collect(self):
        """The engine's state at scrape time (as the core sent it after its last step or command)."""
        state, model = self.engine_state(), [self.labels["model_name"]]
        for name, doc, value in (
                ("vllm:num_requests_running", "Sequences in the engine's batch.", state["running"]),
                ("vllm:num_requests_waiting", "Sequences waiting to be scheduled.", state["waiting"]),
                ("vllm:kv_cache_usage_perc", "Fraction of the KV-cache blocks in use (1 = full).",
                 1 - state["free_blocks"] / state["num_blocks"])):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(model, value)
            yield family
        for name, doc, value in (
                ("vllm:num_preemptions", "Sequences preempted (their blocks taken back).", state["preemptions"]),
                ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", state["prefix_queries"]),
                ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", state["prefix_hits"])):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(model, value)
            yield family

    def describe(self):
        return []  # collected at scrape time only

    def exposition(self):
        return generate_latest(self.registry)


class APIError(Exception):
    """An error for the client, in OpenAI's shape: one sentence, the parameter at fault, a status."""

    def __init__(self, message, param=None, status=400, type="invalid_request_error", code=None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers=None):
        # ASCII JSON: a message that quotes the client's text stays valid UTF-8 whatever it holds (a lone surrogate)
        return Response(json.dumps(self.body()), status_code=self.status, headers=headers, media_type="application/json")


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
    a step that raised (500, the server goes on), or the engine process gone (500, and /health says 503)."""

    def __init__(self, options, tokenizer, metrics=None, in_process=False):
        self.commands, self.outputs, self.limits, self.state, self.worker, self.core = start_core(options, in_process)
        self.tokenizer, self.metrics = tokenizer, metrics  # the output thread's own tokenizer
        self.active = {}  # rid -> Generation: the requests in the engine
        # both threads end sequences (the output thread: stop or length; the event loop: a client that left): under this lock a
        # request leaves self.active once, and each of its sequences is counted as ended once
        self.ending = threading.Lock()
        self.next_rid, self.lock = 0, threading.Lock()  # the lock: both threads send commands
        self.closed = False  # set by the output thread when the core is gone, before it fails what is in flight
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
            raise APIError("The engine is not running: retry on another server.", status=503, type="server_error")
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
            elif kind == "failed":  # a bug, not the client's fault
                log.error("engine step failed: %s", message[1])
                self._fail(message[2], APIError(f"The engine failed ({message[1]}); the request was dropped, retry it.",
                                                status=500, type="server_error"))
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


# ----------------------------------------------------------------------------------------------
# The API's requests

# OpenAI's parameters this server does not support, each with the value that asks for nothing (accepted)
UNSUPPORTED = {"echo": False, "logprobs": False, "top_logprobs": 0, "best_of": 1, "suffix": "", "logit_bias": {},
               "presence_penalty": 0, "frequency_penalty": 0, "tools": [], "tool_choice": "none", "functions": [],
               "function_call": "none", "response_format": {"type": "text"}}


def lone_surrogate(value, path=()):
    """The path to the first string (or key) holding a lone UTF-16 surrogate, which JSON can carry
    ("\ud800") and UTF-8 cannot; None if there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
    elif isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate(key, path + (key,)) if isinstance(key, str) else None
            found = found if found is not None else lone_surrogate(item, path + (key,))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate(item, path + (i,))
            if found is not None:
                return found
    return None


class APIModel(BaseModel):
    # strict: "10" and true are not integers; extra fields are kept aside, ignored with a warning (as vLLM does)
    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data):
        """null means "the default", as in OpenAI's API."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def ignored_fields(self, prefix=""):
        """The dotted names of the fields nobody here knows, nested ones included."""
        names = [prefix + str(k) for k in (self.model_extra or {})]
        for name in type(self).model_fields:
            value = getattr(self, name)
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(item, APIModel):
                    names += item.ignored_fields(f"{prefix}{name}{f'[{i}]' if isinstance(value, list) else ''}.")
        return names


class StreamOptions(APIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (with include_usage)


class SamplingRequest(APIModel):
    """What completions and chat completions share."""
    model: str
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM's extensions: top_k (0 or -1: off), min_p, repetition_penalty, ignore_eos, min_tokens
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    # OpenAI's, not supported here: a 400 unless harmless (see UNSUPPORTED)
    echo: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    best_of: Any = None
    suffix: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None

    @model_validator(mode="before")
    @classmethod
    def valid_unicode(cls, data):
        """A lone surrogate anywhere in the body: a 400 naming the parameter, before anything reads it."""
        where = lone_surrogate(data)
        if where is not None:
            shown = ".".join(map(str, where))
            raise APIError(f"'{shown}' holds a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text: "
                           f"send valid UTF-8.", param=str(where[0]) if where else None)
        return data


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16  # OpenAI's default for completions


class TextPart(APIModel):
    type: Literal["text"]
    text: str


class ChatMessage(APIModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # None: up to the model's context
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object: every 4xx and 5xx of this server."""
    error: ErrorDetail


def chat_prompt(messages):
    """A plain template for a base model: a "Role: text" line per message, then "Assistant:" for the
    model to continue."""
    if not messages:
        raise APIError("messages is empty: send at least one message.", param="messages")
    lines = [f"{CHAT_ROLES[m.role]}: {m.content if isinstance(m.content, str) else ''.join(p.text for p in m.content)}"
             for m in messages]
    return "\n".join(lines + ["Assistant:"])


def validation_error(exc):
    """FastAPI's 422 for a body it cannot parse, as OpenAI's 400 with one sentence."""
    error = exc.errors()[0]
    union_member = lambda part: part in ("str", "int", "float", "bool") or "[" in part  # pydantic names the type it tried
    loc = [str(part) for part in error.get("loc", ())[1:] if not union_member(str(part))]  # and "body" comes first
    param = loc[0] if loc else None
    if error["type"] == "json_invalid":
        param = None
        message = f"The request body is not valid JSON ({error.get('ctx', {}).get('error', error['msg'])}): send a JSON object."
    elif not loc:
        message = f"The request body must be a JSON object with the request's parameters ({error['msg']})."
    elif error["type"] == "missing":
        message = f"Missing required parameter: '{'.'.join(loc)}'."
    else:
        message = f"Invalid value for '{'.'.join(loc)}': {error['msg']}."
    return APIError(message, param=param)


class BodyLimit:
    """ASGI middleware: a request body over max_bytes gets a 413, by its Content-Length before it is read,
    or as it arrives when it has none (the body is read here, up to the limit, then handed on)."""

    def __init__(self, app, max_bytes):
        self.app, self.max_bytes = app, max_bytes

    def error(self):
        return APIError(f"The request body is larger than this server's limit of {self.max_bytes:,} bytes: send a smaller request.",
                        status=413)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit():
            if int(length) > self.max_bytes:
                return await self.error().response()(scope, receive, send)
            return await self.app(scope, receive, send)
        body, more = [], True  # no length given (chunked): read it here, counting
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
            if sum(map(len, body)) > self.max_bytes:
                return await self.error().response()(scope, receive, send)
        pending = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


# ----------------------------------------------------------------------------------------------
# The app

class Server:
    """The tokenizer, the engine (its core: a process of its own) and what every endpoint needs of them.
    engine_process=False runs the core in a thread of this process instead (tests reach into its engine)."""

    def __init__(self, model="tiny", max_batch_size=16, num_blocks=None, device=None, enable_prefix_caching=False, engine_process=True):
        self.model_name = str(model)
        self.tokenizer = gpt.load_tokenizer()  # the handlers' (encoding, in the pool: its Rust backend, which is thread-safe)...
        self.encoder = self.tokenizer.backend_tokenizer
        self.metrics = Metrics(lambda: self.engine.state, self.model_name)
        options = EngineOptions(str(model), max_batch_size, num_blocks, device, enable_prefix_caching)
        self.engine = EngineClient(options, gpt.load_tokenizer(), self.metrics, in_process=not engine_process)  # ...and the output thread's
        self.limits = self.engine.limits  # the engine's: context, vocabulary, KV blocks, batch
        self.n_positions, self.vocab_size = self.limits["n_positions"], self.limits["vocab_size"]
        self.pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenizer")
        self.created = int(time.time())
        self.disconnect_poll_s = DISCONNECT_POLL_S
        # no token is longer than this many characters, so a longer text cannot fit the context: refused untokenized
        self.max_token_chars = max(map(len, self.tokenizer.get_vocab()))
        self.max_prompt_chars = (self.n_positions - 1) * self.max_token_chars

    async def in_pool(self, function, *args):
        """Run function(*args) in the tokenizer pool, off the event loop (its exceptions come back here)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    def check_model(self, name):
        if name != self.model_name:
            raise APIError(f"The model '{name}' does not exist: this server serves '{self.model_name}' (GET /v1/models).",
                           param="model", status=404, code="model_not_found")

    def prompt_ids(self, prompt):
        """The prompt's token ids (runs in the pool: a long text takes a while to tokenize)."""
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):  # a batch of prompts
            if len(prompt) != 1:
                raise APIError(f"This server takes one prompt per request, got {len(prompt)}: send each prompt as its own request.",
                               param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str) and len(prompt) > self.max_prompt_chars:
            raise APIError(f"The prompt has {len(prompt):,} characters, more than any prompt that fits the model's context of "
                           f"{self.n_positions} positions ({self.max_prompt_chars:,} characters: no token is longer than "
                           f"{self.max_token_chars}): shorten it.", param="prompt")
        if not isinstance(prompt, str) and len(prompt) >= self.n_positions:  # before looking at every id
            raise APIError(f"The prompt ({len(prompt)} tokens) leaves no room in the model's context of {self.n_positions} "
                           f"positions: shorten it.", param="prompt")
        ids = self.encoder.encode(prompt).ids if isinstance(prompt, str) else list(prompt)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(f"Token id {bad[0]} in the prompt is outside the vocabulary: ids go from 0 to {self.vocab_size - 1}.",
                           param="prompt")
        return ids

    def chat_prompt_ids(self, messages):
        if sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text) for p in m.content) for m in messages) > self.max_prompt_chars:
            raise APIError(f"The messages hold more characters than any prompt that fits the model's context of "
                           f"{self.n_positions} positions ({self.max_prompt_chars:,} characters): shorten them.", param="messages")
        return self.prompt_ids(chat_prompt(messages))

    def checkers(self, body, stop, max_tokens, extra_stop=()):
        """One stop checker per choice (built in the pool: a long stop list takes a moment)."""
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            raise APIError(f"stop has {len(stop)} strings: this server takes at most {MAX_STOP_STRINGS}.", param="stop")
        if any(len(s) > MAX_STOP_LENGTH for s in stop):
            longest = max(map(len, stop))
            raise APIError(f"A stop string has {longest} characters: this server takes stop strings of at most {MAX_STOP_LENGTH}.",
                           param="stop")
        eos = self.limits["eos_token_id"]
        try:
            return [IncrementalStopChecker(self.engine.tokenizer, stop + list(extra_stop), () if body.ignore_eos else (eos,), max_tokens,
                                           body.min_tokens, special_ids=(eos,)) for _ in range(body.n)]
        except ValueError as e:
            raise APIError(str(e), param="stop") from None

    def check(self, body, prompt_ids, max_tokens):
        """Check a request as the engine would, before any work: a 400 naming the parameter at fault."""
        for name, nothing in UNSUPPORTED.items():
            value = getattr(body, name)
            if value is not None and value != nothing:
                raise APIError(f"{name} is not supported by this server: leave it out.", param=name)
        n_positions = self.n_positions
        try:
            check_request(prompt_ids, max_tokens, n_positions)
        except ValueError as e:
            at_fault = "prompt" if not prompt_ids or len(prompt_ids) >= n_positions else "max_tokens"
            raise APIError(str(e).replace("max_new_tokens", "max_tokens"), param=at_fault) from None
        limits = self.limits
        blocks = -(-(len(prompt_ids) + max_tokens - 1) // limits["block_size"])  # as add_request counts them
        if blocks > limits["num_blocks"]:
            raise APIError(f"The prompt plus max_tokens need {blocks} KV blocks and the server has {limits['num_blocks']}: "
                           f"ask for fewer tokens.", param="max_tokens")
        if not 1 <= body.n <= limits["max_batch_size"]:
            raise APIError(f"n is {body.n}: this server runs at most {limits['max_batch_size']} sequences at once, "
                           f"ask for 1 to {limits['max_batch_size']}.", param="n")
        if not 0 <= body.min_tokens <= max_tokens:
            raise APIError(f"min_tokens is {body.min_tokens}: it must be between 0 and max_tokens ({max_tokens}).", param="min_tokens")
        try:
            return SamplingParams(temperature=body.temperature, top_k=0 if body.top_k == -1 else body.top_k, top_p=body.top_p,
                                  min_p=body.min_p, repetition_penalty=body.repetition_penalty, seed=body.seed)
        except ValueError as e:
            raise APIError(str(e), param=str(e).split(" ")[0]) from None  # its messages start with the parameter's name

    async def submit(self, body, prompt_ids, max_tokens, stop, extra_stop=()):
        """Check a request, build its stop checkers (in the pool) and hand it to the engine."""
        sampling = self.check(body, prompt_ids, max_tokens)
        checkers = await self.in_pool(self.checkers, body, stop, max_tokens, extra_stop)
        generation = Generation(prompt_ids, checkers)
        self.engine.add(generation, AddRequest(prompt_ids, max_tokens, body.n, sampling, body.ignore_eos, body.min_tokens))
        return generation

    async def outputs(self, generation):
        """The request's outputs as they come, in lists (all that arrived since the last); raises the
        APIError it failed with."""
        while True:
            items = await generation.take()
            end = next((i for i, item in enumerate(items) if item is None or isinstance(item, APIError)), None)
            if end is None:
                yield merged(items)
                continue
            if end:
                yield merged(items[:end])
            if items[end] is not None:
                raise items[end]
            return

    async def collect(self, generation, http_request):
        """Wait for the whole answer: each choice's text and finish reason. A non-streaming handler hears
        nothing of its client meanwhile, so a watcher asks every disconnect_poll_s and aborts if it left."""
        async def watch():
            while not await http_request.is_disconnected():
                await asyncio.sleep(self.disconnect_poll_s)
            self.engine.abort(generation)

        watcher = asyncio.create_task(watch())
        texts, reasons = [""] * len(generation.checkers), [None] * len(generation.checkers)
        try:
            async for outputs in self.outputs(generation):
                for output in outputs:
                    texts[output.index] += output.text
                    reasons[output.index] = output.finish_reason
        finally:
            watcher.cancel()
        return texts, reasons

    def stream(self, generation, first_chunks, chunks, stream_options, usage_chunk):
        """Server-sent events: each chunk as `data: {json}`, then `data: [DONE]`. With include_usage, a last
        chunk with the usage; with continuous_usage_stats too, the usage so far in every chunk (vLLM's). A
        client that goes away cancels the generator (Starlette listens for the disconnect): the finally
        aborts its request."""
        include_usage = bool(stream_options and stream_options.include_usage)
        continuous = include_usage and stream_options.continuous_usage_stats
        counts = [0] * len(generation.checkers)

        async def events():
            try:
                for chunk in first_chunks:
                    yield sse({**chunk, "usage": generation.usage(0)} if continuous else chunk)
                async for outputs in self.outputs(generation):  # one write for all that arrived at once
                    events = []
                    for output in outputs:
                        counts[output.index] = output.num_tokens
                        events += [sse({**chunk, "usage": generation.usage(sum(counts))} if continuous else chunk)
                                   for chunk in chunks(output)]
                    if events:
                        yield "".join(events)
                if include_usage:
                    yield sse(usage_chunk(generation.usage()))
                yield "data: [DONE]\n\n"
            except APIError as e:  # the engine failed mid-stream: the status is already sent, say it in the stream
                yield sse(e.body())
                yield "data: [DONE]\n\n"
            finally:
                if not generation.done:
                    self.engine.abort(generation)
        return StreamingResponse(events(), media_type="text/event-stream")


def merged(outputs):
    """Outputs that arrived together, one per choice: a handler that fell behind the engine sends each
    choice's new text as one chunk, not one chunk per step (as vLLM merges the outputs a client has not
    taken yet), so the work per chunk, the server's and the client's, is done once."""
    if len(outputs) == 1:
        return outputs
    by_index = {}
    for output in outputs:
        first = by_index.get(output.index)
        by_index[output.index] = output if first is None else Output(output.index, first.text + output.text, output.finish_reason,
                                                                     output.num_tokens)
    return list(by_index.values())


def sse(obj):
    return f"data: {json.dumps(obj)}\n\n"


ERRORS = {400: "Invalid request: OpenAI's error object, `param` names the parameter at fault",
          404: "Unknown model (code model_not_found) or path", 413: "Request body over the server's limit",
          500: "The engine failed; the request was dropped", 503: "The server is shutting down"}


def error_responses(*codes):
    return {code: {"model": ErrorResponse, "description": ERRORS[code]} for code in codes}


# what a generation endpoint answers: one JSON object, or with stream: true server-sent events
STREAMED = {200: {"description": "The answer (JSON), or with stream: true its chunks as server-sent events (`data: {json}` lines, "
                                 "then `data: [DONE]`)",
                  "content": {"text/event-stream": {"schema": {  # one event: its data field, a chunk's JSON or [DONE]
                      "type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}}}}}


def openapi_schema(app):
    """FastAPI's schema, less the 422 it documents for every body (this server answers 400 instead)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes, description=app.description)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(model="tiny", max_batch_size=16, num_blocks=None, device=None, enable_prefix_caching=False,
               max_body_bytes=MAX_BODY_BYTES, engine_process=True):
    """The FastAPI app serving `model` (any name gpt.load_model takes): the engine's process starts here
    (a model that does not load raises here) and serves while the app does (its lifespan).
    app.state.server holds the Server; engine_process=False: the engine in a thread (tests reach into it)."""
    server = Server(model, max_batch_size, num_blocks, device, enable_prefix_caching, engine_process)

    @asynccontextmanager
    async def lifespan(app):
        # what is loaded by now (torch, transformers, FastAPI: ~300,000 objects) lives as long as the server: out of the
        # garbage collector's sight, a full collection takes microseconds instead of a 100-200 ms stall of every stream (vLLM does it too)
        gc.collect()
        gc.freeze()
        server.engine.start()
        yield
        server.engine.shutdown()
        server.pool.shutdown(wait=False)

    app = FastAPI(title="GPT-2 workshop: OpenAI-compatible server", lifespan=lifespan)
    app.state.server = server
    app.openapi = lambda: openapi_schema(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(APIError)
    async def api_error(request, exc):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc):
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # 404 for an unknown path, 405 (with its Allow header), ...: OpenAI's shape too
        return APIError(f"{exc.detail}: {request.method} {request.url.path}.", status=exc.status_code).response(exc.headers)

    @app.get("/health")
    async def health():
        if not server.engine.alive:
            return APIError("The engine is not running: restart the server.", status=503, type="server_error").response()
        state = server.engine.state
        return {"status": "ok", **{key: state[key] for key in ("running", "waiting", "free_blocks", "num_blocks", "aborted")}}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                                                                   "description": "Prometheus text format"}})
    async def metrics():
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def model_card():
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "gpt2-inference-workshop",
                "max_model_len": server.n_positions}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}", responses=error_responses(404))
    async def get_model(name: str):
        server.check_model(name)
        return model_card()

    def warn_ignored(body):
        ignored = body.ignored_fields()
        if ignored:  # one line per request, as vLLM logs it
            log.warning("The following fields were present in the request but ignored: %s", ignored)

    @app.post("/v1/completions", responses={**STREAMED, **error_responses(400, 404, 413, 500)})
    async def completions(body: CompletionRequest, http_request: HTTPRequest):
        warn_ignored(body)
        server.check_model(body.model)
        prompt_ids = await server.in_pool(server.prompt_ids, body.prompt)
        generation = await server.submit(body, prompt_ids, body.max_tokens, body.stop)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def response(choices, **extra):
            return {"id": rid, "object": "text_completion", "created": created, "model": server.model_name, "choices": choices, **extra}

        def choice(index, text, finish_reason):
            return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

        if body.stream:
            return server.stream(generation, [], lambda out: [response([choice(out.index, out.text, out.finish_reason)])],
                                 body.stream_options, lambda usage: response([], usage=usage))
        result = await server.collect(generation, http_request)
        return response([choice(i, text, reason) for i, (text, reason) in enumerate(zip(*result))], usage=generation.usage())

    @app.post("/v1/chat/completions", responses={**STREAMED, **error_responses(400, 404, 413, 500)})
    async def chat_completions(body: ChatRequest, http_request: HTTPRequest):
        warn_ignored(body)
        server.check_model(body.model)
        prompt_ids = await server.in_pool(server.chat_prompt_ids, body.messages)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:  # OpenAI's default: as many as the context leaves
            max_tokens = max(1, server.n_positions - len(prompt_ids))
        generation = await server.submit(body, prompt_ids, max_tokens, body.stop, [CHAT_STOP])
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def response(kind, choices, **extra):
            return {"id": rid, "object": kind, "created": created, "model": server.model_name, "choices": choices, **extra}

        def delta(index, content, finish_reason=None):
            return {"index": index, "delta": content, "logprobs": None, "finish_reason": finish_reason}

        def chunks(out):  # the text, then the finish reason in a chunk of its own, as OpenAI sends them
            parts = [delta(out.index, {"content": out.text})] if out.text else []
            parts += [delta(out.index, {}, out.finish_reason)] if out.finish_reason else []
            return [response("chat.completion.chunk", [part]) for part in parts]

        if body.stream:
            first = [response("chat.completion.chunk", [delta(i, {"role": "assistant", "content": ""})]) for i in range(body.n)]
            return server.stream(generation, first, chunks, body.stream_options,
                                 lambda usage: response("chat.completion.chunk", [], usage=usage))
        result = await server.collect(generation, http_request)
        choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
                   for i, (text, reason) in enumerate(zip(*result))]
        return response("chat.completion", choices, usage=generation.usage())

    return app


def serve(model="tiny", host="127.0.0.1", port=8000, max_batch_size=16, num_blocks=None, device=None, enable_prefix_caching=False,
          max_body_bytes=MAX_BODY_BYTES):
    """Load the model and serve it until interrupted (Ctrl-C)."""
    import uvicorn

    app = create_app(model, max_batch_size, num_blocks, device, enable_prefix_caching, max_body_bytes)
    print(f"Serving {model!r} at http://{host}:{port}/v1 (OpenAI-compatible; GET /health, /v1/models, /metrics)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info")
