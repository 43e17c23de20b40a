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

The server by job, as vLLM's OpenAI entrypoints are split:

    protocol.py         the API's request bodies, and OpenAI's error object (APIError) for every 4xx and 5xx
    openai_serving.py   what every endpoint does with a request: tokenize, check, submit, collect or stream
    engine_client.py    the engine core's client: add / abort, and the output thread (token ids -> text)
    stop_checker.py     incremental detokenization with exercise 6's stop rules
    metrics.py          the Prometheus metrics, under vLLM's names
    server.py           this: the app (its routes, the body limit, its OpenAPI schema), create_app and serve
"""

import gc
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from workshop.serving.openai_serving import CHAT_STOP, MAX_STOP_LENGTH, MAX_STOP_STRINGS, Server
from workshop.serving.protocol import APIError, ChatRequest, CompletionRequest, ErrorResponse, validation_error
from workshop.serving.stop_checker import IncrementalStopChecker

# what serve.py and the tests import from here: the app, and the names they check it with (defined where they are used)
__all__ = ["create_app", "serve", "MAX_BODY_BYTES", "CHAT_STOP", "MAX_STOP_LENGTH", "MAX_STOP_STRINGS", "IncrementalStopChecker"]

log = logging.getLogger("workshop.serving.server")

MAX_BODY_BYTES = 1 << 20  # a request body over 1 MiB gets a 413 (a full context of token ids is a few kB)


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
               max_body_bytes=MAX_BODY_BYTES, engine_process=True, enforce_eager=False):
    """The FastAPI app serving `model` (any name gpt.load_model takes): the engine's process starts here
    (a model that does not load raises here) and serves while the app does (its lifespan).
    app.state.server holds the Server; engine_process=False: the engine in a thread (tests reach into it)."""
    server = Server(model, max_batch_size, num_blocks, device, enable_prefix_caching, engine_process, enforce_eager)

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
            why = f" ({server.engine.death})" if server.engine.death else ""
            return APIError(f"The engine is not running{why}: restart the server.", status=503, type="server_error").response()
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
          max_body_bytes=MAX_BODY_BYTES, enforce_eager=False):
    """Load the model and serve it until interrupted (Ctrl-C)."""
    import uvicorn

    app = create_app(model, max_batch_size, num_blocks, device, enable_prefix_caching, max_body_bytes, enforce_eager=enforce_eager)
    print(f"Serving {model!r} at http://{host}:{port}/v1 (OpenAI-compatible; GET /health, /v1/models, /metrics)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="info")
