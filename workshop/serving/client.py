"""The serving benchmark's online half: drive an OpenAI-compatible server (serve.py, or vLLM, SGLang,
TGI...) over HTTP and keep one workshop.serving.runs.RequestRecord per request, so the same
serving_metrics() reports it.

Every request is a streaming completion (`stream: true`, server-sent events) sent at its arrival
time (workload.arrival_times: all at once, or a Poisson process), greedy (temperature 0), with
max_tokens = its output length and the prompt as token ids. As vLLM's `bench serve` does, the client
is aiohttp reading the event lines and json.loads: a benchmark's client shares the machine with the
server, and the official `openai` client parses each chunk into objects at about five times the CPU
(tests/test_server_clients.py drives the server with that client). The client stamps each streamed
chunk as it arrives: the first one gives the time to first token, the gaps between chunks the
inter-token latencies (a chunk that carries several tokens counts once, as in vLLM). Output tokens are
the server's count (stream_options.include_usage), else the chunks.

    with launch_server("tiny", max_batch_size=16) as base_url:    # python serve.py on a free port
        run = run_online(base_url, workload)                        # a ServingRun with its records
        print(serving_metrics(run.records, run.seconds))
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tqdm.auto import tqdm

from workshop.serving.runs import RequestRecord, ServingRun

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url, timeout=120.0, process=None):
    """Poll GET /health (next to /v1) until the server answers 200; raise if it does not within
    `timeout` seconds, or if `process` (the server we started) exits first."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it answered {url}: see its output above.")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no answer from {url} within {timeout:.0f} s: is the server running there?")


@contextmanager
def launch_server(model="tiny", max_batch_size=None, port=None, extra_args=(), timeout=180.0, log=None):
    """Start `python serve.py --model MODEL --host 127.0.0.1 --port PORT` (a free port by default) in a
    session of its own (as a server started from another shell), wait until /health answers, yield its
    base URL (http://127.0.0.1:PORT/v1), stop it afterwards.
    log: a file for the server's output (default: discarded)."""
    port = port or free_port()
    command = [sys.executable, str(ROOT / "serve.py"), "--model", model, "--host", "127.0.0.1", "--port", str(port), *extra_args]
    if max_batch_size:
        command += ["--max-batch-size", str(max_batch_size)]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    # its own session, as a server started from another shell: with Linux's autogroup scheduling the CPU a busy machine
    # leaves is shared between sessions, and the client's work is not taken from the server's share (nor the other way)
    process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/v1", timeout, process)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log:
            out.close()


def served_model(base_url):
    """The id of the first model the server lists (GET /v1/models)."""
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        return client.models.list().data[0].id


def run_online(base_url, workload, model=None, ignore_eos=False, timeout=600.0, progress=True, label="online"):
    """Send every request of `workload` (token-id prompts, max_new_tokens, arrival_times in seconds)
    to the server at base_url as a streaming completion at its arrival time, all concurrently.
    Returns a ServingRun: seconds from the first request sent to the last answer, the text of each
    answer in .outputs, one RequestRecord per request in .records (a failed request: success False,
    its error). ignore_eos: ask the server to run every request to max_tokens (vLLM's extension)."""
    model = model or served_model(base_url)
    return asyncio.run(_run_online(base_url, workload, model, ignore_eos, timeout, progress, label))


async def _run_online(base_url, workload, model, ignore_eos, timeout, progress, label):
    import aiohttp

    bar = tqdm(total=len(workload), desc=f"{label}: requests", unit="req", disable=not progress, leave=False)
    url = base_url.rstrip("/") + "/completions"
    # no limit on connections: every request streams on its own, as many at once as the workload sends
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        results = await asyncio.gather(*[_request(session, url, model, p, n, t, start, ignore_eos, bar) for p, n, t in
                                         zip(workload.prompts, workload.max_new_tokens, workload.arrival_times)])
        seconds = time.perf_counter() - start
    bar.close()
    records, texts = zip(*results) if results else ((), ())
    tokens = sum(r.output_len for r in records if r.success)
    return ServingRun(label, None, tokens, seconds, None, None, [r.e2el for r in records if r.success],
                      outputs=list(texts), records=list(records))


async def _request(session, url, model, prompt_ids, max_tokens, arrival, start, ignore_eos, bar):
    """One streaming completion, sent at `arrival` seconds after start: (RequestRecord, its text)."""
    await asyncio.sleep(max(0.0, arrival - (time.perf_counter() - start)))
    body = {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    sent = time.perf_counter() - start
    times, text, usage = [], "", None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:500]}")
            async for line in response.content:  # server-sent events: "data: {json}" lines, then "data: [DONE]"
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:  # an error after the stream began comes as an event
                    raise RuntimeError(chunk["error"].get("message", chunk["error"]))
                if chunk.get("choices"):
                    times.append(time.perf_counter() - start)
                    text += chunk["choices"][0].get("text") or ""
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
        if not times:
            raise RuntimeError("the stream ended without a token")
        record = RequestRecord(len(prompt_ids), usage if usage is not None else len(times), sent, times)
    except Exception as error:  # noqa: BLE001 (any failure of one request is that request's failure, as in vLLM)
        record = RequestRecord(len(prompt_ids), 0, sent, times, success=False, error=f"{type(error).__name__}: {error}")
    bar.update()
    return record, text
