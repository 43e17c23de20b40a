"""What every OpenAI endpoint does with a request (vLLM's OpenAIServing): tokenize its prompt in a thread
pool, off the event loop; check it as the engine would, before any work (a 400 naming the parameter at
fault); build its stop checkers; hand it to the engine client; then collect its outputs into one answer, or
stream them as server-sent events. Server holds the tokenizer, the engine client and the metrics."""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi.responses import StreamingResponse

import gpt
from gpt import check_request
from workshop.serving.engine_client import EngineClient, Generation, Output
from workshop.serving.engine_core import AddRequest, EngineOptions
from workshop.serving.metrics import Metrics
from workshop.serving.protocol import UNSUPPORTED, APIError
from workshop.serving.sampling import SamplingParams
from workshop.serving.stop_checker import IncrementalStopChecker

CHAT_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOP = "\nUser:"  # a base model happily writes the user's next turn too: the end of the assistant's
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request asks whether its client is still there
MAX_STOP_STRINGS = 64  # OpenAI allows 4; vLLM no limit: a bound keeps one request from slowing every step
MAX_STOP_LENGTH = 128  # characters per stop string: the tail the stop matcher looks at per token
TOKENIZER_THREADS = 2  # the pool that tokenizes prompts off the event loop


def chat_prompt(messages):
    """A plain template for a base model: a "Role: text" line per message, then "Assistant:" for the
    model to continue."""
    if not messages:
        raise APIError("messages is empty: send at least one message.", param="messages")
    lines = [f"{CHAT_ROLES[m.role]}: {m.content if isinstance(m.content, str) else ''.join(p.text for p in m.content)}"
             for m in messages]
    return "\n".join(lines + ["Assistant:"])


class Server:
    """The tokenizer, the engine (its core: a process of its own) and what every endpoint needs of them.
    engine_process=False runs the core in a thread of this process instead (tests reach into its engine)."""

    def __init__(self, model="tiny", max_batch_size=16, num_blocks=None, device=None, enable_prefix_caching=False, engine_process=True,
                 enforce_eager=False):
        self.model_name = str(model)
        self.tokenizer = gpt.load_tokenizer()  # the handlers' (encoding, in the pool: its Rust backend, which is thread-safe)...
        self.encoder = self.tokenizer.backend_tokenizer
        self.metrics = Metrics(lambda: self.engine.state, self.model_name)
        options = EngineOptions(str(model), max_batch_size, num_blocks, device, enable_prefix_caching, enforce_eager)
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
