"""Online serving benchmark: drive an OpenAI-compatible server over HTTP, as vLLM's `bench serve` does.

    python bench/serve_bench.py --launch                                  # start serve.py on a free port and drive it
    python bench/serve_bench.py --base-url http://127.0.0.1:8000/v1       # a server already running (serve.py, vLLM, ...)
    python bench/serve_bench.py --launch --request-rate 4 --num-prompts 64 --out online.json
    python bench/serve_bench.py --launch --compare-offline                # and the same engine in this process, same requests

Requests: --num-prompts prompts sampled from the local --model (token ids, GPT-2's vocabulary),
lengths drawn from --prompt-len and --output-len (max_tokens), greedy, streamed (server-sent events),
sent all at once (--request-rate inf) or as a Poisson process, by an aiohttp client (as vLLM's). Prints
vLLM's result block (successful and failed requests, duration, request / output / total token
throughput, goodput for --goodput SLOs, mean / median / p99 of TTFT, TPOT, ITL and E2E latency);
--out writes it as a row (JSON list and CSV). The library: workshop/serving/client.py.

Outside benchmark clients work against serve.py as against vLLM (tests/test_server_clients.py replays
the request bodies they send): start the server (`python serve.py --max-batch-size 16`), then, from
any machine that can reach it (the tiny model's context is 512 tokens: keep prompt + output within it;
models/tiny holds GPT-2's tokenizer, so `--processor` / `--tokenizer models/tiny` works offline):

    # guidellm (the vLLM project's; checked with 0.8.1, whose command is `run`): a sweep from one request at a time
    # to the most the server takes, 30 s per rate
    guidellm run --backend kind=openai_http,target=http://127.0.0.1:8000,model=tiny \
        --tokenizer kind=huggingface_auto,model=models/tiny --profile kind=sweep \
        --data kind=synthetic_text,prompt_tokens=128,output_tokens=64 --constraint kind=max_duration,seconds=30
    #   (guidellm before 0.8: `guidellm benchmark --target ... --processor models/tiny --data "prompt_tokens=128,output_tokens=64"
    #   --profile sweep --max-seconds 30`; a sweep needs requests to finish within each rate's seconds on your machine)

    # vLLM's bench serve (not checked here: vLLM does not install on this project's CPU machines)
    vllm bench serve --backend openai --base-url http://127.0.0.1:8000 --model tiny --tokenizer models/tiny \
        --dataset-name random --random-input-len 128 --random-output-len 64 --num-prompts 64 --ignore-eos

    # NVIDIA's aiperf (checked with 0.13.0). Leave HF_HUB_OFFLINE unset for it: with it set, aiperf 0.13 fails to
    # load a local tokenizer folder (its own bug); models/tiny is local, so nothing is downloaded either way
    aiperf profile --model tiny --url 127.0.0.1:8000 --endpoint-type completions --streaming --tokenizer models/tiny \
        --synthetic-input-tokens-mean 128 --output-tokens-mean 64 --request-count 64 --extra-inputs ignore_eos:true

They send ignore_eos, min_tokens, stream_options.continuous_usage_stats (guidellm) and fields of other
servers (ignored, one warning line each in the server's log); GET /metrics shows the server's side in
vLLM's metric names while they run.
"""

import argparse

import torch

import gpt
from workshop.serving import runs as serving
from workshop.serving import bench as serving_bench
from workshop.grading.harness import run_script
from workshop.serving.client import launch_server, run_online
from workshop.serving.workloads import mixed_workload


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the server's http://HOST:PORT/v1")
    where.add_argument("--launch", action="store_true", help="start `python serve.py` on a free loopback port, stop it at the end")
    p.add_argument("--model", default="tiny", help="the model that samples the prompts, and that --launch serves")
    p.add_argument("--max-batch-size", type=int, default=8, help="--launch: the server's max batch size (and --compare-offline's)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second, Poisson (inf: all at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="*", default=["ttft:500", "tpot:25"], metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--ignore-eos", action="store_true", help="send vLLM's ignore_eos (the server must accept it)")
    p.add_argument("--compare-offline", action="store_true",
                   help="also run serve.py's engine (exercise 5's reference) in this process on the same requests, taking turns")
    p.add_argument("--repeats", type=int, default=1, help="--compare-offline: rounds (the median is reported)")
    p.add_argument("--out", help="write the result row(s) to this JSON file and a .csv beside it")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    goodput = serving.parse_goodput(args.goodput)
    rate = None if args.request_rate == float("inf") else args.request_rate
    model = gpt.load_model(args.model)
    if args.launch:
        with launch_server(args.model, args.max_batch_size) as base_url:
            rows = bench(args, model, base_url, rate, goodput)
    else:
        rows = bench(args, model, args.base_url, rate, goodput)
    if args.out:
        for path in serving_bench.write_rows(rows, args.out):
            print(f"wrote {path}")


def bench(args, model, base_url, rate, goodput):
    print(f"{base_url}: {args.num_prompts} requests, prompts of {args.prompt_len[0]}-{args.prompt_len[1]} tokens, max_tokens "
          f"{args.output_len[0]}-{args.output_len[1]}, {'all at once' if rate is None else f'{rate:g} requests/s (Poisson)'}", flush=True)
    if args.compare_offline:
        record = serving_bench.online_vs_offline(model, base_url, args.num_prompts, args.prompt_len, args.output_len, rate,
                                                 args.max_batch_size, args.repeats, args.ignore_eos, args.seed, goodput,
                                                 not args.no_progress)
        print(serving_bench.format_result(record["online"]))
        return serving_bench.rows({"online": record})
    workload = mixed_workload(model, args.num_prompts, prompt_len=tuple(args.prompt_len), output_len=tuple(args.output_len),
                              rate=rate, seed=args.seed)
    warm_up = mixed_workload(model, 1, prompt_len=(4, 8), output_len=(2, 4), seed=args.seed + 1)
    (test,) = run_online(base_url, warm_up, progress=False).records  # vLLM's initial test run: one request, not measured
    if not test.success:
        raise RuntimeError(f"the first request to {base_url} failed ({test.error}): is it an OpenAI-compatible completions server?")
    run = run_online(base_url, workload, ignore_eos=args.ignore_eos, progress=not args.no_progress)
    metrics = run.metrics(goodput)
    print(serving_bench.format_result(metrics))
    for record in run.records:
        if not record.success:
            print(f"failed: {record.error}")
            break
    return [{"engine": "server", "mode": "online", "scenario": "serve", "request_rate": "inf" if rate is None else rate,
             "batch_size": None, "base_url": base_url, **metrics}]


if __name__ == "__main__":
    run_script(main, RuntimeError, TimeoutError)
