"""Schemathesis against the server's own OpenAPI schema (GET /openapi.json): bounded and derandomized
(the same few hundred cases on every run), every operation, positive and negative bodies. Each
response must be no 5xx and must agree with the schema: a documented status code, a documented content
type, a body of the documented shape (OpenAI's error object for every 4xx), the documented headers.

    pytest tests/test_server_schema.py
"""


import pytest
import schemathesis
import schemathesis.checks as checks
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation import GenerationMode

from tests.server_support import running
from workshop.serving.server import create_app

EXAMPLES = 80  # per generation endpoint and mode (10 per GET endpoint): 360 cases, well under a minute on 2 cores
MAX_TOKENS = 16  # a fuzzed body asks for at most this many tokens (n of them at most 8): the engine's work stays small


@pytest.fixture(scope="module")
def served_url():
    """The app (tiny model) on a free loopback port, its engine process running (the app's lifespan)."""
    app = create_app("tiny", max_batch_size=8, device="cpu")
    with running(app, log_level="error") as url:
        yield url


# What "agrees with the schema" means here. Left out: positive_data_acceptance and negative_data_rejection,
# which hold that every body the schema allows gets a 2xx and every other a 4xx: this server answers a
# documented 400 for limits a JSON schema does not state (the prompt plus max_tokens must fit the context,
# stop strings are non-empty, the KV cache must hold the request), and ignores unknown fields (as vLLM does).
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_headers_conformance, checks.response_schema_conformance, checks.unsupported_method]

OPERATIONS = ["GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{name}", "POST /v1/completions",
              "POST /v1/chat/completions"]


@pytest.fixture(scope="module")
def api_schema(served_url):
    schema = schemathesis.openapi.from_url(served_url + "/openapi.json")
    labels = sorted(result.ok().label for result in schema.get_all_operations())
    assert labels == sorted(OPERATIONS), f"the schema's operations are {labels}: list the new ones in OPERATIONS"
    return schema


CASES = [pytest.param(operation, mode, id=f"{operation}-{name}") for operation in OPERATIONS
         for mode, name in ((GenerationMode.POSITIVE, "valid"), (GenerationMode.NEGATIVE, "invalid"))
         if mode is GenerationMode.POSITIVE or operation.startswith("POST")]  # a GET here takes no input that could be invalid


@pytest.mark.parametrize("operation, mode", CASES)
def test_every_response_agrees_with_the_schema(api_schema, operation, mode):
    """EXAMPLES cases of the operation (bodies valid by the schema, or not), each sent and checked by schemathesis' checks: no 5xx, status code,
    content type, headers and body as documented. Valid bodies name the served model (a fuzzed name gets
    its 404 before anything else is looked at: tests/test_server.py checks that one); max_tokens (and chat's
    max_completion_tokens) is bounded to keep the run short."""
    method, path = operation.split(" ")

    def served_model(case):
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):  # an invalid body stays as it was drawn
            case.body["model"] = "tiny"
            # chat's max_completion_tokens wins over its max_tokens, and with neither it may write up to the context: bound both
            for field in ("max_tokens", "max_completion_tokens") if "chat" in path else ("max_tokens",):
                value = case.body.get(field)
                if value is None or type(value) is int:
                    case.body[field] = MAX_TOKENS if value is None else min(value, MAX_TOKENS)
        return case

    strategy = api_schema[path][method].as_strategy(generation_mode=mode).map(served_model)

    @given(strategy)
    @settings(max_examples=EXAMPLES if method == "POST" else 10, derandomize=True, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def check(case):
        case.call_and_validate(checks=CHECKS)

    check()
