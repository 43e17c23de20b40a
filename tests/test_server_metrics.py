"""The server's /metrics count one thing each: a sequence, one of a request's n choices (vLLM's v1 engine runs a
request with n > 1 as n child requests, and its metrics count the children).

Every sequence the engine takes adds its prompt's length to vllm:prompt_tokens when it is added and, when it
ends, one vllm:request_success (labelled stop, length, abort or error) and one end-to-end latency sample;
one TTFT sample when its first token reaches it, one inter-token sample for each later step that gives it
tokens, and those tokens to vllm:generation_tokens. The request gauges count sequences too. A client that
leaves ends each unfinished sequence of its request as "abort": counted at once, with its end-to-end time.
So after any mix of requests, cancelled ones included:

    request_success (all reasons) == e2e count == sequences;  TTFT count == sequences that got a token;
    generation_tokens == TTFT count + inter-token count;      prompt_tokens == sum of each sequence's prompt

    pytest tests/test_server_metrics.py
"""

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_support import running
from workshop.serving.server import create_app

MODEL = "tiny"
SUCCESS, E2E, TTFT, ITL = ("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count",
                           "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count")
GENERATION, PROMPT = "vllm:generation_tokens_total", "vllm:prompt_tokens_total"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
LONG = 400  # tokens a cancelled request asks for (ignore_eos): it is still running when its client leaves
PROMPT_IDS = [464, 3290, 286, 262, 995]  # five tokens


@pytest.fixture(scope="module")
def served():
    """The app on a free port; yields (base URL, the Server). A non-streaming client that leaves is noticed
    within 50 ms."""
    app = create_app(MODEL, max_batch_size=8, device="cpu")
    app.state.server.disconnect_poll_s = 0.05
    with running(app) as url:
        yield url, app.state.server


def scrape(url):
    """{name: value} for the samples without labels but model_name, {("success", reason): value} for
    vllm:request_success_total by finish reason."""
    response = httpx.get(url + "/metrics", timeout=30)
    assert response.status_code == 200, response.text
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            if sample.name == SUCCESS:
                values["success", labels["finished_reason"]] = sample.value
                values[SUCCESS] = values.get(SUCCESS, 0) + sample.value
            elif not labels and not sample.name.endswith("_created"):
                values[sample.name] = sample.value
    return values


def settled(url, before, sequences, timeout=60):
    """The counters' growth since `before` once `sequences` sequences have ended, the engine is idle and two
    scrapes 0.2 s apart agree (a loaded machine may still be counting the last step). With `before` empty:
    the counters themselves, once nothing changes."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        now = scrape(url)
        grown = {key: now[key] - before.get(key, 0) for key in now if key not in (RUNNING, WAITING)}
        idle = now[RUNNING] == now[WAITING] == 0
        if idle and grown.get(SUCCESS, 0) >= sequences and grown == last:
            return grown
        assert time.monotonic() < deadline, (f"/metrics did not settle within {timeout} s at {sequences} finished sequences: "
                                             f"{grown}, {now[RUNNING]} running, {now[WAITING]} waiting")
        last = grown
        time.sleep(0.2)


def assert_one_unit(grown, sequences, reasons, prompt_tokens):
    """Every counter and histogram counts the same sequences."""
    assert grown[SUCCESS] == sequences, f"request_success counted {grown[SUCCESS]} sequences, not {sequences}: {grown}"
    assert {reason: grown.get(("success", reason), 0) for reason in reasons} == reasons, f"finish reasons: {grown}"
    assert grown[E2E] == sequences, f"{grown[E2E]} end-to-end latency samples for {sequences} sequences"
    assert grown[TTFT] == sequences, f"{grown[TTFT]} TTFT samples for {sequences} sequences (each got a token)"
    assert grown[GENERATION] == grown[TTFT] + grown[ITL], ("a token is either a sequence's first (a TTFT sample) or a later "
                                                           f"step's (an inter-token sample): {grown}")
    assert grown[PROMPT] == prompt_tokens, f"prompt_tokens grew by {grown[PROMPT]}, not {prompt_tokens} (the prompt once per sequence)"


def tally(reasons):
    counts = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_n_choices_count_as_n_sequences_everywhere(served):
    """n=3, whole and streamed: three request_success, three TTFT and three end-to-end samples each, the
    prompt counted three times, and as many generation tokens as the usage says."""
    url, _ = served
    before = settled(url, {}, 0)  # every counter, once nothing runs
    whole = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": PROMPT_IDS, "n": 3, "max_tokens": 12, "temperature": 1.0, "seed": 7,
        "stop": ["\n"]}).json()
    reasons = [choice["finish_reason"] for choice in whole["choices"]]
    streamed_reasons, usage = [None] * 3, None
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "n": 3, "max_tokens": 10,
            "temperature": 1.0, "seed": 8, "stream": True, "stream_options": {"include_usage": True}}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk["choices"]:
                    streamed_reasons[choice["index"]] = choice["finish_reason"] or streamed_reasons[choice["index"]]
                usage = chunk.get("usage") or usage
    assert None not in streamed_reasons and usage, (streamed_reasons, usage)
    grown = settled(url, before, 6)
    assert_one_unit(grown, 6, tally(reasons + streamed_reasons),
                    3 * whole["usage"]["prompt_tokens"] + 3 * usage["prompt_tokens"])
    assert grown[GENERATION] == whole["usage"]["completion_tokens"] + usage["completion_tokens"], (
        f"generation_tokens grew by {grown[GENERATION]}, the answers' usage says "
        f"{whole['usage']['completion_tokens']} + {usage['completion_tokens']}")


def test_cancelled_requests_count_each_sequence_once_as_aborted(served):
    """A stream (n=3) its client closes after a few tokens and a whole request (n=2) its client gives up on:
    each of their sequences ends once, as "abort", with its end-to-end time; their tokens up to the abort are
    counted (at least those the client saw), and the gauges counted the sequences while they ran."""
    url, _ = served
    before = settled(url, {}, 0)  # every counter, once nothing runs
    body = {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": LONG, "temperature": 0, "ignore_eos": True}

    seen = 0
    with httpx.stream("POST", url + "/v1/completions", timeout=120, json={
            **body, "n": 3, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen = json.loads(line[6:])["usage"]["completion_tokens"]  # every choice's tokens so far
                if seen >= 12:  # a few steps in, each of the three with tokens: scraped while the stream is open
                    during = scrape(url)
                    break  # leaving the loop closes the stream mid-way: the client has gone
    assert during[RUNNING] + during[WAITING] == 3, f"the gauges count sequences: one request with n=3 is 3, got {during}"

    async def give_up():
        """A whole request whose client leaves once both its sequences have their first token."""
        ttft = (await asyncio.to_thread(scrape, url))[TTFT]
        async with httpx.AsyncClient(timeout=120) as client:
            task = asyncio.create_task(client.post(url + "/v1/completions", json={**body, "n": 2}))
            deadline = time.monotonic() + 60
            while (await asyncio.to_thread(scrape, url))[TTFT] < ttft + 2 and not task.done():
                assert time.monotonic() < deadline, "the whole request's sequences got no token within 60 s"
                await asyncio.sleep(0.02)
            if task.done():  # a machine so fast that it finished first: counted as finished, not aborted
                return [choice["finish_reason"] for choice in (await task).json()["choices"]]
            task.cancel()  # the client leaves: its connection closes
            with pytest.raises(asyncio.CancelledError):
                await task
        return ["abort"] * 2

    whole_reasons = asyncio.run(give_up())
    grown = settled(url, before, 5)
    assert_one_unit(grown, 5, tally(["abort"] * 3 + whole_reasons), 5 * len(PROMPT_IDS))
    assert seen <= grown[GENERATION] < 5 * LONG, (f"generation_tokens grew by {grown[GENERATION]}: at least the {seen} tokens the "
                                                 f"stream's client saw, and fewer than the sequences asked for")
