"""An OpenAI-compatible HTTP server in front of the workshop's paged engine (exercise 5's reference).

    HTTP handlers (asyncio, uvicorn)                     the engine loop (one background thread)
    validate, tokenize, submit  ---- commands queue ---->  add_request / abort, between steps
    SSE chunks or one response  <--- asyncio.Queue  -----  step(); each sequence's new text

One thread owns the engine and runs it continuously: requests join and leave its batch at every
step (continuous batching), and each new token's text goes back to its HTTP request as soon as the
step that made it ends, so a streaming client sees its first token after one step (real TTFT), not
the whole answer at the end. The handlers never touch the engine; they talk to its thread through
two queues. Every request either finishes or fails with a reason: none is dropped.

    POST /v1/completions        prompt: a string or a list of token ids
    POST /v1/chat/completions   messages, through a plain "User: ... / Assistant:" template
    GET  /v1/models, /health

Parameters: max_tokens, temperature, top_p, stop, seed, n, stream (+ stream_options.include_usage),
and vLLM's extensions top_k, min_p, repetition_penalty. Anything else OpenAI has (logprobs, echo,
best_of, penalties, tools, ...) gets a 400 that says so. Start it with `python serve.py`.
"""

import asyncio
import json
import logging
import queue
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.exceptions import HTTPException

import gpt
from gpt import EOS_TOKEN_ID, check_request
from solutions.ex5_paged_kv_cache import Engine, Request
from solutions.ex6_decoding import SamplingParams, StopChecker

log = logging.getLogger("workshop.server")

CHAT_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOP = "\nUser:"  # a base model happily writes the user's next turn too: the end of the assistant's
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request asks whether its client is still there
STEP_HISTORY = 1000  # per-step statistics the engine keeps (the counters are kept whole)


# ----------------------------------------------------------------------------------------------
# Text: incremental detokenization with exercise 6's stop rules

class IncrementalStopChecker(StopChecker):
    """Exercise 6's StopChecker, the same pieces token for token (stop token, stop strings across tokens,
    text held back while it may still become a stop string or ends in half a UTF-8 character), but
    add() decodes only the last few tokens: the exercise's decodes them all at every add, quadratic in
    the output's length."""

    def __init__(self, tokenizer, stop=(), stop_token_ids=(EOS_TOKEN_ID,), max_new_tokens=None):
        super().__init__(tokenizer, stop, stop_token_ids, max_new_tokens)
        self.text_ids = []  # the tokens that make text: all but a stop token
        self.done = ""  # the text of text_ids[:read], which ends in a whole character: it never changes
        self.prefix = self.read = 0  # decoding restarts at text_ids[prefix], a token boundary a little before read

    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            self.text_ids.append(token)
            searched = len(self.done)  # the text so far had no stop string: a new one ends after this
            self._decode()
            found = [i for i in (self.text.find(s, max(0, searched - len(s) + 1)) for s in self.stop) if i >= 0]
            if found:
                self.text, self.finish_reason = self.text[:min(found)], "stop"
            elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
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

    def _safe_length(self):
        """Up to half a character at the end, and up to the earliest suffix that begins a stop string
        (the exercise's rule, looking at the last characters only)."""
        text, longest = self.text, max(map(len, self.stop), default=0)
        end = len(text) - text.endswith("\ufffd")
        for start in range(max(0, end - longest + 1), end):
            if any(s.startswith(text[start:end]) for s in self.stop):
                return start
        return end


# ----------------------------------------------------------------------------------------------
# The engine, and the thread that runs it

class ServingEngine(Engine):
    """Exercise 5's engine plus what a server needs and the exercise does not: abort() takes a sequence
    out wherever it is (its client left, or a stop string matched) and frees its blocks; and nothing
    is kept once a request is done, since a server runs for ever."""

    num_aborted = 0  # sequences taken out before the engine finished them

    def add_request(self, request):
        seqs = super().add_request(request)
        self.sequences.clear()  # offline, the result lists every sequence; here the list would only grow
        return seqs

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
        self.finished.clear()  # the loop reads each sequence's state instead
        for history in (self.stats.batch_sizes, self.stats.scheduled_tokens, self.stats.blocks_in_use, self.stats.tokens_stored):
            if len(history) > 2 * STEP_HISTORY:
                del history[:-STEP_HISTORY]

    @property
    def busy(self):
        return bool(self.pending or self.waiting or self.running)


class APIError(Exception):
    """An error for the client, in OpenAI's shape: one sentence, the parameter at fault, a status."""

    def __init__(self, message, param=None, status=400, type="invalid_request_error", code=None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self):
        return JSONResponse(self.body(), status_code=self.status)


@dataclass
class Output:
    index: int  # which of the request's n choices
    text: str  # new text, safe to show
    finish_reason: str | None  # None while it runs, then "stop" or "length"


class Generation:
    """One HTTP request inside the engine: its engine Request, a stop checker per continuation, and the
    asyncio queue its outputs arrive on (Output items, then None when all are done, or an APIError)."""

    def __init__(self, request, checkers):
        self.request, self.checkers = request, checkers
        self.seqs = []  # the engine's sequences, once added
        self.loop, self.outputs = asyncio.get_running_loop(), asyncio.Queue()
        self.done = False  # set by the engine thread when it has sent the last item

    def send(self, item):
        """From the engine thread: hand an item to the request's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is gone, nobody is listening
            pass

    def finish(self, error=None):
        self.done = True
        self.send(error)

    def usage(self):
        prompt, completion = len(self.request.prompt_ids), sum(len(c.token_ids) for c in self.checkers)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class EngineLoop:
    """The one thread that owns the engine. Between steps it takes new requests and aborts off a
    thread-safe queue; after each step it sends every sequence's new text to its request. With
    nothing to run it blocks on the queue (no busy loop)."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        self.commands = queue.SimpleQueue()
        self.active = {}  # Generation -> None: the requests in the engine, in arrival order
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self):
        self.engine.start = time.perf_counter()  # once: arrival times are read on this clock
        self.thread.start()

    def submit(self, generation):
        self.commands.put(("add", generation))

    def abort(self, generation):
        self.commands.put(("abort", generation))

    def shutdown(self, timeout=10):
        self.commands.put(("stop", None))
        self.thread.join(timeout)

    def _run(self):
        torch.set_num_threads(1)  # torch's thread setting is per thread: this one runs every forward
        while self._take_commands(wait=not self.engine.busy):
            if not self.engine.busy:
                continue
            try:
                steps = self.engine.stats.steps
                self.engine.step()
                self.engine.step_index += 1
                if self.engine.stats.steps == steps and not self.engine.running:
                    raise RuntimeError(f"the engine ran nothing while {len(self.engine.waiting)} sequences wait")
                self._publish()
            except Exception as e:  # a bug, not the client's fault: fail what is in flight, keep serving
                log.exception("engine step failed")
                self._fail_all(APIError(f"The engine failed ({type(e).__name__}: {e}); the request was dropped, retry it.",
                                        status=500, type="server_error"))
        self._fail_all(APIError("The server is shutting down: retry on another one.", status=503, type="server_error"))

    def _take_commands(self, wait):
        """Apply every queued command; block for the first one if wait. False once told to stop."""
        while True:
            try:
                kind, generation = self.commands.get(block=wait)
            except queue.Empty:
                return True
            wait = False
            if kind == "stop":
                return False
            if kind == "add":
                try:
                    generation.seqs = self.engine.add_request(generation.request)
                    self.active[generation] = None
                except ValueError as e:  # the handler checks first; this is the engine's own word
                    generation.finish(APIError(str(e)))
            elif kind == "abort" and generation in self.active:  # the client left: free its slots
                self._abort(generation)
                generation.finish(APIError("The client closed the connection: its request was aborted.", status=499))

    def _abort(self, generation):
        for seq in generation.seqs:
            self.engine.abort(seq)
        del self.active[generation]

    def _publish(self):
        """After a step: each sequence's new tokens through its stop checker, the text to its request."""
        for generation in list(self.active):
            for index, (seq, checker) in enumerate(zip(generation.seqs, generation.checkers)):
                if checker.finished:
                    continue
                pieces = []
                for token in seq.output_ids[len(checker.token_ids):]:
                    pieces.append(checker.add(token))
                    if checker.finished:
                        break
                if checker.finished and seq.finished_step < 0:
                    self.engine.abort(seq)  # a stop string: stop computing it, free its blocks now
                if pieces and (pieces != [""] or checker.finished):
                    generation.send(Output(index, "".join(pieces), checker.finish_reason))
            if all(c.finished for c in generation.checkers):
                del self.active[generation]
                generation.finish()

    def _fail_all(self, error):
        for generation in list(self.active):
            try:
                self._abort(generation)
            finally:
                generation.finish(error)
        self.active.clear()


# ----------------------------------------------------------------------------------------------
# The API's requests

# OpenAI's parameters this server does not support, each with the value that asks for nothing (accepted)
UNSUPPORTED = {"echo": False, "logprobs": False, "top_logprobs": 0, "best_of": 1, "suffix": "", "logit_bias": {},
               "presence_penalty": 0, "frequency_penalty": 0, "tools": [], "tool_choice": "none", "functions": [],
               "function_call": "none", "response_format": {"type": "text"}}


class APIModel(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown parameter is an error, as OpenAI's API has it

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data):
        """null means "the default", as in OpenAI's API."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(APIModel):
    include_usage: bool = False


class SamplingRequest(APIModel):
    """What completions and chat completions share."""
    model: str
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM's extensions: top_k (0 or -1: off), min_p, repetition_penalty
    min_p: float = 0.0
    repetition_penalty: float = 1.0
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
    elif error["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: '{'.'.join(loc)}'; this server does not know it."
    else:
        message = f"Invalid value for '{'.'.join(loc)}': {error['msg']}."
    return APIError(message, param=param)


# ----------------------------------------------------------------------------------------------
# The app

class Server:
    """The model, its tokenizer and the engine loop, and what every endpoint needs of them."""

    def __init__(self, model="tiny", max_batch_size=16, num_blocks=None, device=None):
        self.model_name = str(model)
        self.model = gpt.load_model(model, device=device)
        self.config = self.model.config
        self.tokenizer = gpt.load_tokenizer()  # the handlers' (encoding)...
        self.engine = ServingEngine(self.model, max_batch_size, num_blocks=num_blocks)
        self.loop = EngineLoop(self.engine, gpt.load_tokenizer())  # ...and the engine thread's own: one each, never shared
        self.created = int(time.time())
        self.disconnect_poll_s = DISCONNECT_POLL_S

    def check_model(self, name):
        if name != self.model_name:
            raise APIError(f"The model '{name}' does not exist: this server serves '{self.model_name}' (GET /v1/models).",
                           param="model", status=404, code="model_not_found")

    def prompt_ids(self, prompt):
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):  # a batch of prompts
            if len(prompt) != 1:
                raise APIError(f"This server takes one prompt per request, got {len(prompt)}: send each prompt as its own request.",
                               param="prompt")
            prompt = prompt[0]
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise APIError(f"Token id {bad[0]} in the prompt is outside the vocabulary: ids go from 0 to {self.config.vocab_size - 1}.",
                           param="prompt")
        return ids

    def submit(self, body, prompt_ids, max_tokens, stop):
        """Check a request as the engine would, before any work, and hand it to the engine thread."""
        for name, nothing in UNSUPPORTED.items():
            value = getattr(body, name)
            if value is not None and value != nothing:
                raise APIError(f"{name} is not supported by this server: leave it out.", param=name)
        try:
            check_request(prompt_ids, max_tokens, self.config.n_positions)
        except ValueError as e:
            raise APIError(str(e).replace("max_new_tokens", "max_tokens"),
                           param="max_tokens" if prompt_ids and max_tokens < 1 else "prompt") from None
        blocks = -(-(len(prompt_ids) + max_tokens - 1) // self.engine.block_size)  # as add_request counts them
        if blocks > self.engine.allocator.num_blocks:
            raise APIError(f"The prompt plus max_tokens need {blocks} KV blocks and the server has {self.engine.allocator.num_blocks}: "
                           f"ask for fewer tokens.", param="max_tokens")
        if not 1 <= body.n <= self.engine.max_batch_size:
            raise APIError(f"n is {body.n}: this server runs at most {self.engine.max_batch_size} sequences at once, "
                           f"ask for 1 to {self.engine.max_batch_size}.", param="n")
        try:
            sampling = SamplingParams(temperature=body.temperature, top_k=0 if body.top_k == -1 else body.top_k, top_p=body.top_p,
                                      min_p=body.min_p, repetition_penalty=body.repetition_penalty, seed=body.seed)
        except ValueError as e:
            raise APIError(str(e), param=str(e).split(" ")[0]) from None  # its messages start with the parameter's name
        try:
            checkers = [IncrementalStopChecker(self.loop.tokenizer, stop, (self.engine.eos_token_id,), max_tokens)
                        for _ in range(body.n)]
        except ValueError as e:
            raise APIError(str(e), param="stop") from None
        request = Request(prompt_ids, max_tokens, arrival_time=self.engine.clock(), n=body.n, sampling=sampling)
        generation = Generation(request, checkers)
        self.loop.submit(generation)
        return generation

    async def outputs(self, generation):
        """The request's outputs as they come; raises the APIError it failed with."""
        while (item := await generation.outputs.get()) is not None:
            if isinstance(item, APIError):
                raise item
            yield item

    async def collect(self, generation, http_request):
        """Wait for the whole answer: each choice's text and finish reason. A non-streaming handler hears
        nothing of its client meanwhile, so a watcher asks every disconnect_poll_s and aborts if it left."""
        async def watch():
            while not await http_request.is_disconnected():
                await asyncio.sleep(self.disconnect_poll_s)
            self.loop.abort(generation)

        watcher = asyncio.create_task(watch())
        texts, reasons = [""] * len(generation.checkers), [None] * len(generation.checkers)
        try:
            async for output in self.outputs(generation):
                texts[output.index] += output.text
                reasons[output.index] = output.finish_reason
        finally:
            watcher.cancel()
        return texts, reasons

    def stream(self, generation, first_chunks, chunks, include_usage, usage_chunk):
        """Server-sent events: each chunk as `data: {json}`, then `data: [DONE]`. A client that goes away
        cancels the generator (Starlette listens for the disconnect): the finally aborts its request."""
        async def events():
            try:
                for chunk in first_chunks:
                    yield sse(chunk)
                async for output in self.outputs(generation):
                    for chunk in chunks(output):
                        yield sse(chunk)
                if include_usage:
                    yield sse(usage_chunk(generation.usage()))
                yield "data: [DONE]\n\n"
            except APIError as e:  # the engine failed mid-stream: the status is already sent, say it in the stream
                yield sse(e.body())
                yield "data: [DONE]\n\n"
            finally:
                if not generation.done:
                    self.loop.abort(generation)
        return StreamingResponse(events(), media_type="text/event-stream")


def sse(obj):
    return f"data: {json.dumps(obj)}\n\n"


def create_app(model="tiny", max_batch_size=16, num_blocks=None, device=None):
    """The FastAPI app serving `model` (any name gpt.load_model takes); the engine thread runs while the
    app does (its lifespan). app.state.server holds the Server (tests read its engine)."""
    server = Server(model, max_batch_size, num_blocks, device)

    @asynccontextmanager
    async def lifespan(app):
        server.loop.start()
        yield
        server.loop.shutdown()

    app = FastAPI(title="GPT-2 workshop: OpenAI-compatible server", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(request, exc):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc):
        return validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # 404 for an unknown path, 405, ...: OpenAI's shape too
        return APIError(f"{exc.detail}: {request.method} {request.url.path}.", status=exc.status_code).response()

    @app.get("/health")
    async def health():
        engine = server.engine
        if not server.loop.thread.is_alive():
            return APIError("The engine thread is not running.", status=503, type="server_error").response()
        return {"status": "ok", "running": len(engine.running), "waiting": len(engine.waiting) + len(engine.pending),
                "free_blocks": engine.allocator.num_free_blocks, "num_blocks": engine.allocator.num_blocks,
                "aborted": engine.num_aborted}

    def model_card():
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "gpt2-inference-workshop",
                "max_model_len": server.config.n_positions}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        server.check_model(name)
        return model_card()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http_request: HTTPRequest):
        server.check_model(body.model)
        generation = server.submit(body, server.prompt_ids(body.prompt), body.max_tokens, () if body.stop is None else body.stop)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def response(choices, **extra):
            return {"id": rid, "object": "text_completion", "created": created, "model": server.model_name, "choices": choices, **extra}

        def choice(index, text, finish_reason):
            return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

        if body.stream:
            return server.stream(generation, [], lambda out: [response([choice(out.index, out.text, out.finish_reason)])],
                                 body.stream_options and body.stream_options.include_usage, lambda usage: response([], usage=usage))
        result = await server.collect(generation, http_request)
        return response([choice(i, text, reason) for i, (text, reason) in enumerate(zip(*result))], usage=generation.usage())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, http_request: HTTPRequest):
        server.check_model(body.model)
        prompt_ids = server.prompt_ids(chat_prompt(body.messages))
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:  # OpenAI's default: as many as the context leaves
            max_tokens = max(1, server.config.n_positions - len(prompt_ids))
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        generation = server.submit(body, prompt_ids, max_tokens, stop + [CHAT_STOP])
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
            return server.stream(generation, first, chunks, body.stream_options and body.stream_options.include_usage,
                                 lambda usage: response("chat.completion.chunk", [], usage=usage))
        result = await server.collect(generation, http_request)
        choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
                   for i, (text, reason) in enumerate(zip(*result))]
        return response("chat.completion", choices, usage=generation.usage())

    return app


def serve(model="tiny", host="127.0.0.1", port=8000, max_batch_size=16, num_blocks=None, device=None):
    """Load the model and serve it until interrupted (Ctrl-C)."""
    import uvicorn

    app = create_app(model, max_batch_size, num_blocks, device)
    print(f"Serving {model!r} at http://{host}:{port}/v1 (OpenAI-compatible; GET /health, /v1/models)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info")
