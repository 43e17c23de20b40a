"""The server as real clients use it: the request bodies that guidellm, aiperf and vLLM's `bench serve`
send, the model folder's tokenizer, vLLM's extensions (ignore_eos, min_tokens, continuous usage stats),
the limits that keep one request from stalling the others, GET /metrics, and the HTTP details
(413, 405 with Allow, the OpenAPI schema's error responses).

    pytest tests/test_server_clients.py
"""

import asyncio
import json
import logging
import os
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gpt
from tests.server_support import running
from workshop.serving.server import (
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    IncrementalStopChecker,
    create_app,
)
from workshop.tokenizers import varied_text

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
BODY_LIMIT = 200_000  # small, so that the 413 test sends little


@pytest.fixture(scope="module")
def served():
    """The app on a free port (uvicorn in a thread); yields (base URL, the Server)."""
    app = create_app(MODEL, max_batch_size=8, device="cpu", max_body_bytes=BODY_LIMIT)
    with running(app) as url:
        yield url, app.state.server


def sse_events(response):
    """The JSON objects of a server-sent event stream, up to [DONE] (which must come)."""
    events, done = [], False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        assert not done, "data after [DONE]"
        if line == "data: [DONE]":
            done = True
        else:
            events.append(json.loads(line[len("data: "):]))
    assert done, "the stream did not end with data: [DONE]"
    return events


def post(url, path, body, stream=False):
    if stream:
        with httpx.stream("POST", url + path, json=body, timeout=60) as response:
            assert response.status_code == 200, f"{body}: status {response.status_code}, {response.read()!r}"
            return sse_events(response)
    response = httpx.post(url + path, json=body, timeout=60)
    assert response.status_code == 200, f"{body}: status {response.status_code}, {response.text}"
    return response.json()


# ----------------------------------------------------------------------------------------------
# The model folder's tokenizer

def test_the_model_folder_loads_with_autotokenizer_offline():
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ours = gpt.load_tokenizer()
    for name in ("tiny", "tiny-draft"):
        theirs = AutoTokenizer.from_pretrained(str(ROOT / "models" / name))
        assert theirs.eos_token_id == gpt.EOS_TOKEN_ID and len(theirs) == 50257, name
        assert theirs.encode("Hello world") == [15496, 995], name
        for seed in range(20):
            text = varied_text(seed)
            assert theirs.encode(text) == ours.encode(text), f"{name}: other ids than the project's tokenizer on {text!r}"
            assert theirs.decode(theirs.encode(text)) == text


# ----------------------------------------------------------------------------------------------
# The bodies benchmark clients send (written from their request-building code)

PROMPT = "ROMEO: What light through yonder window breaks? It is the east, and Juliet is the sun."

CLIENT_BODIES = {  # name -> (path, body, streamed)
    # guidellm (src/guidellm/backends/openai/request_handlers.py): fixed output length = max_tokens, stop None, ignore_eos;
    # streaming asks for usage in every chunk
    "guidellm-completions": ("/v1/completions", {"model": MODEL, "stream": True, "prompt": PROMPT, "max_tokens": 12, "stop": None,
                                                 "ignore_eos": True,
                                                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, True),
    "guidellm-chat": ("/v1/chat/completions", {"model": MODEL, "stream": True, "max_completion_tokens": 12, "stop": None,
                                               "ignore_eos": True,
                                               "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                                               "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]}, True),
    "guidellm-completions-whole": ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "stop": None,
                                                       "ignore_eos": True}, False),
    # vLLM's bench serve (vllm/benchmarks/lib/endpoint_request_func.py): logprobs null, repetition_penalty 1.0, usage at the end,
    # --ignore-eos, sampling parameters through extra_body
    "vllm-bench-completions": ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "repetition_penalty": 1.0, "max_tokens": 12,
                                                   "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
                                                   "ignore_eos": True, "temperature": 0.0}, True),
    "vllm-bench-chat": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                                                 "max_completion_tokens": 12, "stream": True, "stream_options": {"include_usage": True},
                                                 "ignore_eos": True, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 3}, True),
    # aiperf (src/aiperf/endpoints/openai_completions.py, openai_chat.py): the prompt as a list of texts, --extra-inputs
    # (min_tokens, ignore_eos, and fields of other servers), include_usage added when streaming
    "aiperf-completions": ("/v1/completions", {"prompt": [PROMPT], "model": MODEL, "stream": True, "max_tokens": 12, "min_tokens": 12,
                                               "ignore_eos": True, "stream_options": {"include_usage": True}}, True),
    "aiperf-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "model": MODEL, "stream": False,
                                             "max_completion_tokens": 12, "min_tokens": 12, "ignore_eos": True,
                                             "nvext": {"ignore_eos": True}, "skip_special_tokens": True}, False),
}


@pytest.mark.parametrize("name", list(CLIENT_BODIES))
def test_benchmark_clients_request_bodies_get_200s(served, name):
    path, body, streamed = CLIENT_BODIES[name]
    chat, wanted = "chat" in path, body.get("max_tokens") or body.get("max_completion_tokens")
    got = post(served[0], path, body, streamed)
    if not streamed:
        choice = got["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        assert isinstance(text, str) and choice["finish_reason"] == "length", got
        assert got["usage"]["completion_tokens"] == wanted, f"{name}: ignore_eos asks for exactly {wanted} tokens: {got['usage']}"
        return
    chunks = [c for c in got if c["choices"]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"] for c in chunks)
    assert isinstance(text, str) and chunks[-1]["choices"][0]["finish_reason"] == "length", got[-3:]
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == wanted, f"{name}: the last chunk's usage: {got[-1]}"
    assert got[-1]["usage"]["prompt_tokens"] > 0
    if body.get("stream_options", {}).get("continuous_usage_stats"):
        counts = [c["usage"]["completion_tokens"] for c in got]
        assert all("usage" in c for c in got), f"{name}: continuous_usage_stats asks for usage in every chunk"
        assert counts == sorted(counts) and counts[-1] == wanted, f"{name}: the usage so far should grow to {wanted}: {counts}"


def test_unknown_fields_are_ignored_with_one_warning(served, caplog):
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "frobnicate": 1, "stream_options": {"include_usage": False, "x": 2}}
    with caplog.at_level(logging.WARNING, logger="workshop.serving.server"):
        post(served[0], "/v1/completions", body)
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(lines) == 1 and "frobnicate" in lines[0] and "stream_options.x" in lines[0], lines


def test_min_tokens_and_ignore_eos_keep_going_past_the_end_of_text(served):
    """A prompt the tiny model ends at once (greedy): without them the answer stops early; with ignore_eos
    or min_tokens it has max_tokens (min_tokens) tokens, and the end-of-text token shows no text."""
    url, server = served
    eos_prompt = [gpt.EOS_TOKEN_ID] * 3
    plain = post(url, "/v1/completions", {"model": MODEL, "prompt": eos_prompt, "max_tokens": 40, "temperature": 0})
    for extra in ({"ignore_eos": True}, {"min_tokens": 40}):
        got = post(url, "/v1/completions", {"model": MODEL, "prompt": eos_prompt, "max_tokens": 40, "temperature": 0, **extra})
        assert got["usage"]["completion_tokens"] == 40, f"{extra}: {got['usage']}"
        assert "<|endoftext|>" not in got["choices"][0]["text"]
        assert got["choices"][0]["text"].startswith(plain["choices"][0]["text"])


def test_stop_checker_min_tokens_and_special_tokens():
    tokenizer = gpt.load_tokenizer()
    ids = tokenizer.encode(" to be or not to be")
    eos = gpt.EOS_TOKEN_ID
    checker = IncrementalStopChecker(tokenizer, [" not"], max_new_tokens=20, min_tokens=4)
    pieces = []
    for t in [ids[0], eos, *ids[1:]]:
        pieces.append(checker.add(t))
        if checker.finished:
            break
    assert "".join(pieces) == checker.text and "<|endoftext|>" not in checker.text
    assert checker.finish_reason == "stop" and checker.text == " to be or", checker.text
    early = IncrementalStopChecker(tokenizer, [" be"], max_new_tokens=20, min_tokens=5)  # a stop string before min_tokens: no stop
    for t in ids:
        early.add(t)
        if early.finished:
            break
    assert early.text == " to be or not to" and early.finish_reason == "stop", early.text


# ----------------------------------------------------------------------------------------------
# Limits: nothing stalls the others

def test_request_size_limit_gets_a_413(served):
    response = httpx.post(served[0] + "/v1/completions", json={"model": MODEL, "prompt": "x" * (BODY_LIMIT + 10)})
    assert response.status_code == 413 and f"{BODY_LIMIT:,} bytes" in response.json()["error"]["message"], response.text

    def chunked():  # no Content-Length: counted as it arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(BODY_LIMIT // 10_000 + 1):
            yield b"y" * 10_000
        yield b'"}'

    response = httpx.post(served[0] + "/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text


def test_stop_list_limits_are_named(served):
    for stop, limit in ((["a"] * (MAX_STOP_STRINGS + 1), MAX_STOP_STRINGS), (["b" * (MAX_STOP_LENGTH + 1)], MAX_STOP_LENGTH)):
        response = httpx.post(served[0] + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "stop": stop})
        assert response.status_code == 400 and str(limit) in response.json()["error"]["message"], response.text


def stream_gaps(url, prompt, max_tokens, **extra):
    """The gaps (s) between the chunks of one streamed completion, measured by the client as they arrive."""
    times = []
    with httpx.stream("POST", url + "/v1/completions", timeout=120,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "ignore_eos": True, **extra}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times[1:], times[2:])]  # from the second chunk on: the first follows the prefill


def test_a_huge_request_does_not_stall_an_unrelated_stream(served):
    """An unrelated stream's median inter-chunk gap while huge (but allowed) requests are served beside it,
    against the same stream beside ordinary requests that make the engine do the same work: huge is a
    prompt of nearly the whole context sent as text (tokenized in the pool) with the most stop strings of
    the longest length the server allows (each token looked at against all of them), streamed, three at
    once, and the longest text prompt the server takes (tokenized, then refused: it does not fit the
    context), twice; ordinary is the same prompts as token ids without stop strings, and short refused
    requests. Paired round by round (which goes first alternates), the median ratio stays under 2."""
    url, server = served
    text = varied_text(11, pieces=2000)
    ids = server.tokenizer.encode(text)[:440]
    huge_prompt = server.tokenizer.decode(ids)
    ids = server.tokenizer.encode(huge_prompt)  # the same tokens the server will see
    stops = [f"{i:03d}" + "\u00e6" * (MAX_STOP_LENGTH - 3) for i in range(MAX_STOP_STRINGS)]  # never in the text
    longest = (text * (server.max_prompt_chars // len(text) + 1))[:server.max_prompt_chars]  # the longest text taken
    statuses = []

    def refused(prompt):
        statuses.append(httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=120).status_code)

    loads = {"huge": [(stream_gaps, (url, huge_prompt, 60), {"stop": stops})] * 3 + [(refused, (longest,), {})] * 2,
             "ordinary": [(stream_gaps, (url, ids, 60), {})] * 3 + [(refused, ([198] * 600,), {})] * 2}

    def beside(load):
        threads = [threading.Thread(target=f, args=args, kwargs=kwargs) for f, args, kwargs in loads[load]]
        for t in threads:
            t.start()
        time.sleep(0.05)
        gap = statistics.median(stream_gaps(url, "ROMEO:", 40))
        for t in threads:
            t.join()
        return gap

    stream_gaps(url, "ROMEO:", 8)  # warm-up
    ratios = []
    for round_ in range(3):
        order = ("huge", "ordinary") if round_ % 2 else ("ordinary", "huge")
        gaps = {load: beside(load) for load in order}
        ratios.append(gaps["huge"] / gaps["ordinary"])
    assert statuses == [400] * 12, statuses
    assert statistics.median(ratios) < 2.0, (f"the unrelated stream's inter-token latency was {statistics.median(ratios):.1f}x "
                                             f"longer beside huge requests than beside ordinary ones (rounds: "
                                             f"{[round(r, 2) for r in ratios]})")


# ----------------------------------------------------------------------------------------------
# HTTP details

def test_405_says_allow_and_the_schema_documents_400_not_422(served):
    response = httpx.get(served[0] + "/v1/completions")
    assert response.status_code == 405 and response.headers.get("allow") == "POST", response.headers
    assert response.json()["error"]["message"].endswith(".")
    schema = httpx.get(served[0] + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"400", "404", "413"} <= set(responses), (path, list(responses))
        assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]


# ----------------------------------------------------------------------------------------------
# Metrics

def scrape(url):
    """{(name, frozenset of labels other than model_name): value} from GET /metrics."""
    response = httpx.get(url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain"), response.headers
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL, sample
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "model_name")
            values[sample.name, labels] = sample.value
    return values


def test_metrics_add_up_to_what_the_clients_received(served):
    url, server = served
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
             "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
             "vllm:e2e_request_latency_seconds_count")
    before = scrape(url)
    for name in names:
        assert (name, frozenset()) in before, f"/metrics has no {name}"

    async def load():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def one(i):
                body = {"model": MODEL, "prompt": f"Request {i}: to be or not", "max_tokens": 8 + 3 * i, "temperature": 0,
                        "stream": i % 2 == 0, "stream_options": {"include_usage": True}, "stop": ["\n\n"] if i % 3 == 0 else None}
                if not body["stream"]:
                    return (await client.post("/v1/completions", json=body)).json()["usage"]
                usage = None
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {") and '"usage"' in line:
                            usage = json.loads(line[6:])["usage"]
                return usage

            tasks = [asyncio.create_task(one(i)) for i in range(12)]
            await asyncio.sleep(0.2)
            during = await asyncio.to_thread(scrape, url)  # mid-load
            return await asyncio.gather(*tasks), during

    usages, during = asyncio.run(load())
    after = scrape(url)
    delta = lambda name: after[name, frozenset()] - before[name, frozenset()]
    assert during["vllm:num_requests_running", frozenset()] + during["vllm:num_requests_waiting", frozenset()] >= 0
    assert 0 <= during["vllm:kv_cache_usage_perc", frozenset()] <= 1
    assert delta("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert delta("vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages), "generation tokens != completion tokens sent"
    assert delta("vllm:e2e_request_latency_seconds_count") == len(usages)
    assert delta("vllm:time_to_first_token_seconds_count") == len(usages)
    assert delta("vllm:inter_token_latency_seconds_count") == sum(u["completion_tokens"] - 1 for u in usages)
    finished = sum(v - before.get(k, 0) for k, v in after.items() if k[0] == "vllm:request_success_total")
    assert finished == len(usages)
    assert after["vllm:num_requests_running", frozenset()] == 0 and after["vllm:kv_cache_usage_perc", frozenset()] == 0


# ----------------------------------------------------------------------------------------------
# Fuzzing: odd values in every field get a 200 or OpenAI's 4xx error object, never a 5xx

ODD = [None, True, False, 0, 1, -1, 3, 2**64, -2**70, 1.5, -0.5, 1e30, float("nan"), float("inf"), "", "10", "x", "\ud800",
       "\udfff tail", [], [1], [[1, 2]], ["a", "b"], [None], {}, {"a": 1}, [{"type": "text", "text": "hi"}]]
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "min_tokens", "n", "temperature", "top_p", "top_k",
          "min_p", "repetition_penalty", "seed", "stop", "stream", "stream_options", "ignore_eos", "logprobs", "echo", "user",
          "best_of", "presence_penalty", "unknown_field"]


def test_fuzzed_bodies_never_get_a_5xx(served):
    import random

    rng = random.Random(20)
    url = served[0]
    statuses = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for case in range(200):
            chat = case % 2 == 1
            body = {"model": MODEL, **({"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"}),
                    "max_tokens": 3}
            for field in rng.sample(FIELDS, rng.randint(1, 3)):
                body[field] = rng.choice(ODD)
            if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool) and body["max_tokens"] > 8:
                body["max_tokens"] = 8  # keep each case quick
            raw = json.dumps(body)  # NaN and Infinity as Python's json writes them; lone surrogates as \ud800 escapes
            response = client.post("/v1/chat/completions" if chat else "/v1/completions", content=raw,
                                   headers={"content-type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code in (200, 400, 404), f"case {case}: {raw} -> {response.status_code} {response.text[:300]}"
            if response.status_code != 200:
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"].endswith("."), (raw, error)
            elif body.get("stream") is True:
                assert response.text.rstrip().endswith("data: [DONE]"), (raw, response.text[-200:])
            else:
                assert response.json()["choices"], raw
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 60, statuses
