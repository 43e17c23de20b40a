"""The server's Prometheus metrics (GET /metrics) under vLLM's names: the engine's state read when scraped,
and what the engine client counts as tokens reach their requests; Metrics says what each one counts."""

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
