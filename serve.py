"""Serve a model over an OpenAI-compatible HTTP API (the workshop's paged engine, exercise 5's reference; on a GPU
its decode steps replay CUDA graphs, exercise 11's).

    python serve.py                       # the embedded tiny model at http://127.0.0.1:8000/v1
    python serve.py --model gpt2 --port 8080 --max-batch-size 32

Then any OpenAI client works: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`, and so do
vLLM's and guidellm's benchmark clients (see bench/serve_bench.py); GET /metrics is in Prometheus format.
The app itself is workshop/serving/server.py.
"""

import argparse
import sys

from gpt import ModelLoadError
from workshop.serving.server import MAX_BODY_BYTES, serve


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="any name gpt.load_model takes: tiny, gpt2, a local folder, random-124M, ...")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=int, default=16, help="most sequences the engine runs at once")
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="KV cache blocks of 16 token slots (default: max-batch-size full contexts)")
    parser.add_argument("--enable-prefix-caching", action="store_true", help="reuse the KV blocks of prompts that share a prefix")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs on a GPU: every step eager (as vLLM's flag)")
    parser.add_argument("--max-request-bytes", type=int, default=MAX_BODY_BYTES, help="larger request bodies get a 413")
    args = parser.parse_args()
    try:
        serve(args.model, args.host, args.port, args.max_batch_size, args.num_blocks, enable_prefix_caching=args.enable_prefix_caching,
              max_body_bytes=args.max_request_bytes, enforce_eager=args.enforce_eager)
    except (ModelLoadError, ValueError) as e:  # a bad model name or engine size: one sentence, no traceback
        sys.exit(f"serve.py: {e}")


if __name__ == "__main__":
    main()
