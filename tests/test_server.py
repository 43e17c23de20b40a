"""The OpenAI-compatible server (serve.py, workshop/serving/server.py), driven by the official `openai` client.

The server runs in this process on a free loopback port (uvicorn in a thread), so the tests can look
at its engine. Greedy answers must equal the paged engine's offline output for the same requests,
with the same stop rules as exercise 6's StopChecker; concurrent clients must each get their own text;
a client that leaves must free its slot; bad requests get OpenAI's 400 and the server keeps serving.

    pytest tests/test_server.py
"""

import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import gpt
import solutions.ex5_paged_kv_cache as paged
from solutions.ex6_decoding import StopChecker
from tests.server_support import running
from workshop.serving.sampling import GREEDY, SamplingParams
from workshop.serving.server import CHAT_STOP, IncrementalStopChecker, create_app
from workshop.serving.workloads import sample_prompts

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
MAX_BATCH = 16  # 50 concurrent clients queue up behind it


@pytest.fixture(scope="module")
def served():
    """The app on a free port; yields (base URL, the Server with its engine)."""
    app = create_app(MODEL, max_batch_size=MAX_BATCH, device="cpu")
    with running(app) as url:
        yield url, app.state.server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model():
    return gpt.load_model(MODEL, device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return gpt.load_tokenizer()


def offline(model, tokenizer, prompts, max_tokens, sampling=GREEDY, n=1, stop=()):
    """What the server must answer: the paged engine run offline on the same requests, its tokens through
    exercise 6's StopChecker. One (texts of the n choices, finish reasons, completion tokens) per prompt."""
    requests = [paged.Request(p, m, n=n, sampling=sampling) for p, m in zip(prompts, max_tokens)]
    outputs = iter(paged.generate(model, requests, max_batch_size=MAX_BATCH).outputs)
    answers = []
    for request in requests:
        texts, reasons, tokens = [], [], 0
        for _ in range(n):
            checker = StopChecker(tokenizer, stop, max_new_tokens=request.max_new_tokens)
            for token in next(outputs):
                if checker.finished:
                    break
                checker.add(token)
            texts.append(checker.text), reasons.append(checker.finish_reason)
            tokens += len(checker.token_ids)
        answers.append((texts, reasons, tokens))
    return answers


def workload(model, tokenizer, n, seed, max_tokens=(4, 24)):
    """n seeded prompts, every other one as text (the server tokenizes it), the rest as token ids."""
    rng = random.Random(seed)
    prompts = [tokenizer.decode(p) if i % 2 else p for i, p in enumerate(sample_prompts(model, n, 2, 24, seed))]
    prompt_ids = [tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    return prompts, prompt_ids, [rng.randint(*max_tokens) for _ in range(n)]


def wait_idle(server, timeout=10):
    """Until the engine runs nothing and every KV block is free again (the state its core last sent)."""
    deadline = time.monotonic() + timeout
    while (state := server.engine.state)["running"] or state["waiting"] or state["free_blocks"] < state["num_blocks"]:
        assert time.monotonic() < deadline, (f"the engine is not idle after {timeout} s: {state['running']} running, "
                                             f"{state['waiting']} waiting, {state['free_blocks']} of {state['num_blocks']} blocks free")
        time.sleep(0.02)


def test_health_and_models(served, client):
    health = httpx.get(served[0] + "/health").json()
    assert health["status"] == "ok" and health["free_blocks"] == health["num_blocks"], health
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_completions_equal_the_offline_engine(client, model, tokenizer, seed):
    prompts, prompt_ids, max_tokens = workload(model, tokenizer, 4, seed)
    expected = offline(model, tokenizer, prompt_ids, max_tokens)
    for i, (prompt, m, (texts, reasons, tokens)) in enumerate(zip(prompts, max_tokens, expected)):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=m, temperature=0)
        assert got.choices[0].text == texts[0], f"prompt {i} (seed {seed}): the server's text differs from the offline engine's"
        assert got.choices[0].finish_reason == reasons[0]
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(prompt_ids[i]), tokens)
        assert got.usage.total_tokens == len(prompt_ids[i]) + tokens


def test_streaming_equals_the_offline_engine(client, model, tokenizer):
    prompts, prompt_ids, max_tokens = workload(model, tokenizer, 3, seed=2)
    expected = offline(model, tokenizer, prompt_ids, max_tokens)
    for i, (prompt, m, (texts, reasons, tokens)) in enumerate(zip(prompts, max_tokens, expected)):
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=m, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        pieces = [c.choices[0] for c in chunks if c.choices]
        assert len(pieces) > 1, f"prompt {i}: the answer came in one chunk, not streamed token by token"
        assert "".join(p.text for p in pieces) == texts[0], f"prompt {i}: the streamed pieces do not add up to the offline text"
        assert [p.finish_reason for p in pieces] == [None] * (len(pieces) - 1) + reasons
        assert chunks[-1].usage.completion_tokens == tokens


def test_async_client_and_parallel_sampling(served, model, tokenizer):
    """n continuations of one prompt, seeded, through AsyncOpenAI: each choice equals the offline
    engine's, a second call repeats them, and sampling parameters (vLLM's extensions too) are honoured."""
    prompts, prompt_ids, _ = workload(model, tokenizer, 2, seed=3)
    cases = [({"temperature": 0.9, "top_p": 0.9, "seed": 11}, {}),
             ({"temperature": 1.2, "seed": 5}, {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3})]

    async def ask(prompt, params, extra, stream):
        client = openai.AsyncOpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)
        kwargs = dict(model=MODEL, prompt=prompt, max_tokens=12, n=3, extra_body=extra, **params)
        if not stream:
            return [c.text for c in sorted((await client.completions.create(**kwargs)).choices, key=lambda c: c.index)]
        texts = [""] * 3
        async for chunk in await client.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                texts[c.index] += c.text
        return texts

    async def main():
        return await asyncio.gather(*(ask(p, params, extra, stream) for p in prompts for params, extra in cases
                                      for stream in (False, True)))

    answers = iter(asyncio.run(main()))
    for p in prompt_ids:
        for params, extra in cases:
            expected = offline(model, tokenizer, [p], [12], SamplingParams(**params, **extra), n=3)[0][0]
            assert next(answers) == expected, f"{params} {extra}: not the offline engine's seeded samples"
            assert next(answers) == expected, f"{params} {extra}: streaming the same seeded request gave other samples"


def test_chat_completions(client, model, tokenizer):
    messages = [{"role": "system", "content": "A play."}, {"role": "user", "content": "Who art thou?"},
                {"role": "assistant", "content": "A friend."}, {"role": "user", "content": "Speak, friend."}]
    prompt = tokenizer.encode("System: A play.\nUser: Who art thou?\nAssistant: A friend.\nUser: Speak, friend.\nAssistant:")
    (texts, reasons, tokens), = offline(model, tokenizer, [prompt], [24], stop=[CHAT_STOP])
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert (got.choices[0].message.role, got.choices[0].message.content) == ("assistant", texts[0])
    assert got.choices[0].finish_reason == reasons[0] and got.usage.completion_tokens == tokens
    assert got.usage.prompt_tokens == len(prompt)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=24, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == texts[0]
    assert chunks[-1].choices[0].finish_reason == reasons[0]


def test_fifty_concurrent_streams_each_get_their_own_text(served, model, tokenizer):
    prompts, prompt_ids, max_tokens = workload(model, tokenizer, 50, seed=4, max_tokens=(4, 12))
    expected = offline(model, tokenizer, prompt_ids, max_tokens)

    async def one(client, prompt, m):
        text, reason = "", None
        async for chunk in await client.completions.create(model=MODEL, prompt=prompt, max_tokens=m, temperature=0, stream=True):
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def main():
        client = openai.AsyncOpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0, timeout=60)
        return await asyncio.gather(*(one(client, p, m) for p, m in zip(prompts, max_tokens)))

    got = asyncio.run(main())
    wrong = [i for i, ((text, reason), (texts, reasons, _)) in enumerate(zip(got, expected)) if (text, reason) != (texts[0], reasons[0])]
    assert not wrong, f"{len(wrong)} of 50 concurrent clients got another text than the offline engine's, e.g. request {wrong[0]}"
    wait_idle(served[1])


def test_a_client_that_disconnects_frees_its_slot(served, client):
    server = served[1]
    server.disconnect_poll_s = 0.05
    wait_idle(server)
    aborted, generated = server.engine.state["aborted"], server.engine.state["generated_tokens"]
    stream = client.completions.create(model=MODEL, prompt=[198], max_tokens=500, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # the client goes away mid-stream
    wait_idle(server)
    assert server.engine.state["generated_tokens"] - generated < 500, "the stream's first chunks came only after its last token"
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up waiting
        httpx.post(served[0] + "/v1/completions", json={"model": MODEL, "prompt": [198], "max_tokens": 500}, timeout=0.3)
    wait_idle(server)
    assert server.engine.state["aborted"] == aborted + 2, "each client that left should have had its sequence aborted"
    assert server.engine.state["generated_tokens"] - generated < 1000, "the sequences ran to the end after their clients left"


def broken_sampler(monkeypatch, failures):
    """The engines' sampler (exercise 5's, which the server's engine calls on a CPU) raises at its next `failures` calls."""
    sample, left = paged.sample_tokens, [failures]

    def broken(*args, **kwargs):
        if left[0]:
            left[0] -= 1
            raise TypeError("a simulated fault")
        return sample(*args, **kwargs)

    monkeypatch.setattr(paged, "sample_tokens", broken)


def test_an_engine_failure_fails_the_requests_in_flight_and_the_server_goes_on(monkeypatch):
    """A step that raises: its requests get a 500 (before the stream starts) or an error event (after) that names the
    step and the error; the failed engine (its state half-updated, it refuses every call) is replaced by a new one, which
    serves the next request. The core runs in a thread here, so the test can break its steps."""
    app = create_app(MODEL, max_batch_size=4, device="cpu", engine_process=False)
    core = app.state.server.engine.core
    first = core.engine
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        broken_sampler(monkeypatch, 2)  # the next two steps that sample fail
        with pytest.raises(openai.InternalServerError, match="failed at step 0: TypeError: a simulated fault"):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)
        with pytest.raises(openai.APIError, match="a simulated fault"):  # mid-stream: an error event in the stream
            list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, stream=True))
        wait_idle(app.state.server)
        assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=4).choices[0].finish_reason == "length"
        assert core.engine is not first and first.failure is not None, "the failed engine should have been replaced"
        assert httpx.get(url + "/health").status_code == 200
        assert app.state.server.engine.state["generated_tokens"] >= 4, "the counters should go on across engines"


def test_an_engine_that_cannot_be_replaced_reports_the_server_dead(monkeypatch):
    """A step that raises and no new engine to be had (on a GPU, an error that broke the device): the request gets a
    500, /health a 503 that says why, and a new request a 503 at once, as vLLM's dead engine answers."""
    app = create_app(MODEL, max_batch_size=4, device="cpu", engine_process=False)
    core = app.state.server.engine.core

    def no_engine():
        raise RuntimeError("no device left")

    core.make_engine = no_engine
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        broken_sampler(monkeypatch, 1)
        with pytest.raises(openai.InternalServerError, match="a simulated fault"):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "a simulated fault" in health.text and "no device left" in health.text
        with pytest.raises(openai.InternalServerError, match="engine is not running"):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)


def test_a_dead_engine_process_fails_its_requests_with_a_reason():
    """The engine's process killed mid-stream: the stream ends with an error event that says so, /health
    answers 503 and a new request gets a 503, not a hang."""
    app = create_app(MODEL, max_batch_size=4, device="cpu")
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        stream = iter(client.completions.create(model=MODEL, prompt=[198], max_tokens=400, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}))
        next(stream)  # it runs
        app.state.server.engine.worker.kill()
        with pytest.raises(openai.APIError, match="engine process exited"):
            list(stream)
        assert httpx.get(url + "/health").status_code == 503
        with pytest.raises(openai.InternalServerError, match="engine is not running"):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=4)


def test_stop_strings_cut_the_text(client, model, tokenizer):
    prompts, prompt_ids, _ = workload(model, tokenizer, 3, seed=5)
    full = offline(model, tokenizer, prompt_ids, [24] * 3)
    rng = random.Random(5)
    for i, (prompt, (texts, _, _)) in enumerate(zip(prompts, full)):
        start = rng.randrange(2, len(texts[0]) - 4)
        stop = texts[0][start:start + 3]  # often across a token boundary
        cut = texts[0][:texts[0].find(stop)]
        for stream in (False, True):
            got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "never here"],
                                            stream=stream)
            choices = [c.choices[0] for c in got] if stream else got.choices
            assert "".join(c.text for c in choices) == cut, f"prompt {i}, stop {stop!r}, stream={stream}: text not cut where the stop string starts"
            assert choices[-1].finish_reason == "stop"


def test_incremental_stop_checker_matches_exercise_6(tokenizer):
    """Same pieces, text and finish reason as exercise 6's StopChecker, token by token: on text with
    multi-byte characters (tokens that end inside one) and on random tokens (bytes that make no
    character at all), with stop strings that span tokens."""
    rng = random.Random(6)
    text = "Hark! «Zwölf Boxkämpfer» jagen 🦀 über den Deich; 日本語のテキスト, e finita la commedia. " * 2
    for trial in range(40):
        if trial % 2:
            ids = [rng.randrange(tokenizer.vocab_size) if rng.random() < 0.5 else rng.randrange(94, 256) for _ in range(30)]
        else:
            ids = tokenizer.encode(text)[rng.randrange(10):][:rng.randrange(5, 40)] + ([gpt.EOS_TOKEN_ID] if trial % 4 == 0 else [])
        decoded = tokenizer.decode(ids)
        stop = [decoded[i:i + rng.randint(1, 4)] for i in rng.sample(range(len(decoded)), rng.randrange(3))]
        mine, theirs = IncrementalStopChecker(tokenizer, stop, max_new_tokens=40), StopChecker(tokenizer, stop, max_new_tokens=40)
        for token in ids:
            assert mine.add(token) == theirs.add(token), f"trial {trial}, stop {stop}: a different piece after {len(theirs.token_ids)} tokens"
            if theirs.finished:
                break
        assert (mine.text, mine.finish_reason, mine.token_ids) == (theirs.text, theirs.finish_reason, theirs.token_ids)


BAD = [  # (endpoint, body, param the error names)
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": [198] * 600}, "prompt"),
    ("completions", {"prompt": "Hello", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "Hello there", "max_tokens": 511}, "max_tokens"),
    ("completions", {"prompt": "Hello", "temperature": -1}, "temperature"),
    ("completions", {"prompt": "Hello", "top_p": 0}, "top_p"),
    ("completions", {"prompt": "Hello", "top_p": 1.5}, "top_p"),
    ("completions", {"prompt": "Hello", "n": MAX_BATCH + 1}, "n"),
    ("completions", {"prompt": "Hello", "stop": [""]}, "stop"),
    ("completions", {"prompt": [50257]}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": "Hello", "logprobs": 2}, "logprobs"),
    ("completions", {"prompt": "Hello", "echo": True}, "echo"),
    ("completions", {"prompt": "Hello", "best_of": 3}, "best_of"),
    ("completions", {"prompt": "Hello", "max_tokens": "ten"}, "max_tokens"),
    ("completions", {"prompt": "Hello", "max_tokens": "10"}, "max_tokens"),
    ("completions", {"prompt": "Hello", "max_tokens": True}, "max_tokens"),
    ("completions", {"prompt": "Hello", "seed": 2**64}, "seed"),
    ("completions", {"prompt": "Hello", "min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ("completions", {"prompt": "Hello", "stop": ["x"] * 65}, "stop"),
    ("completions", {"prompt": "Hello", "stop": ["x" * 129]}, "stop"),
    ("completions", {"prompt": "\ud800"}, "prompt"),
    ("completions", {"prompt": "x" * 70000}, "prompt"),
    ("completions", {"max_tokens": 4}, "prompt"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": True}, "max_completion_tokens"),
    ("completions", {"model": "tiny\udfff", "prompt": "Hello"}, "model"),
]


@pytest.mark.parametrize("endpoint, body, param", BAD, ids=[f"{e}-{p}-{i}" for i, (e, _, p) in enumerate(BAD)])
def test_bad_requests_get_openai_400s(served, endpoint, body, param):
    # json.dumps writes a lone surrogate as the escape "\ud800", as a client in another language may send it
    response = httpx.post(f"{served[0]}/v1/{endpoint}", content=json.dumps({"model": MODEL, **body}),
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, f"{body}: status {response.status_code}, {response.text}"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
    assert error["param"] == param, f"{body}: the error names {error['param']!r}, not {param!r}: {error['message']}"
    assert error["message"].endswith(".") and "\n" not in error["message"], f"not one sentence: {error['message']!r}"


def test_after_bad_requests_the_server_still_serves(served, client):
    for raw in (b"{not json", b"[1, 2]", b""):  # malformed bodies: 400, not FastAPI's 422
        response = httpx.post(served[0] + "/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error", response.text
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-5", prompt="Hello", max_tokens=2)
    assert error.value.code == "model_not_found" and error.value.param == "model"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=-2)
    assert error.value.param == "temperature"
    assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=3).usage.completion_tokens >= 1
    wait_idle(served[1])


def test_serve_py_starts_the_server_with_one_command():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    bad = subprocess.run([sys.executable, "serve.py", "--model", "no-such-model"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "Unknown model" in bad.stderr, bad.stderr
    process = subprocess.Popen([sys.executable, "serve.py", "--port", str(port), "--max-batch-size", "4"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"serve.py exited: {process.stdout.read()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve.py did not answer /health within 60 s"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=3).usage.completion_tokens == 3
    finally:
        process.terminate()
        process.wait(30)
