"""The API's side of the server, as vLLM's OpenAI protocol module: the request bodies (pydantic models: strict
types, null as the default, unknown fields kept aside to be ignored with a warning, OpenAI's parameters this
server cannot honour), and OpenAI's error object, which every 4xx and 5xx answers (APIError; FastAPI's
validation errors turned into one)."""

import json
from typing import Any, Literal

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, model_validator


class APIError(Exception):
    """An error for the client, in OpenAI's shape: one sentence, the parameter at fault, a status."""

    def __init__(self, message, param=None, status=400, type="invalid_request_error", code=None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers=None):
        # ASCII JSON: a message that quotes the client's text stays valid UTF-8 whatever it holds (a lone surrogate)
        return Response(json.dumps(self.body()), status_code=self.status, headers=headers, media_type="application/json")


# OpenAI's parameters this server does not support, each with the value that asks for nothing (accepted)
UNSUPPORTED = {"echo": False, "logprobs": False, "top_logprobs": 0, "best_of": 1, "suffix": "", "logit_bias": {},
               "presence_penalty": 0, "frequency_penalty": 0, "tools": [], "tool_choice": "none", "functions": [],
               "function_call": "none", "response_format": {"type": "text"}}


def lone_surrogate(value, path=()):
    """The path to the first string (or key) holding a lone UTF-16 surrogate, which JSON can carry
    ("\ud800") and UTF-8 cannot; None if there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
    elif isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate(key, path + (key,)) if isinstance(key, str) else None
            found = found if found is not None else lone_surrogate(item, path + (key,))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate(item, path + (i,))
            if found is not None:
                return found
    return None


class APIModel(BaseModel):
    # strict: "10" and true are not integers; extra fields are kept aside, ignored with a warning (as vLLM does)
    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data):
        """null means "the default", as in OpenAI's API."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def ignored_fields(self, prefix=""):
        """The dotted names of the fields nobody here knows, nested ones included."""
        names = [prefix + str(k) for k in (self.model_extra or {})]
        for name in type(self).model_fields:
            value = getattr(self, name)
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(item, APIModel):
                    names += item.ignored_fields(f"{prefix}{name}{f'[{i}]' if isinstance(value, list) else ''}.")
        return names


class StreamOptions(APIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (with include_usage)


class SamplingRequest(APIModel):
    """What completions and chat completions share."""
    model: str
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM's extensions: top_k (0 or -1: off), min_p, repetition_penalty, ignore_eos, min_tokens
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    # OpenAI's, not supported here: a 400 unless harmless (see UNSUPPORTED)
    echo: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    best_of: Any = None
    suffix: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None

    @model_validator(mode="before")
    @classmethod
    def valid_unicode(cls, data):
        """A lone surrogate anywhere in the body: a 400 naming the parameter, before anything reads it."""
        where = lone_surrogate(data)
        if where is not None:
            shown = ".".join(map(str, where))
            raise APIError(f"'{shown}' holds a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text: "
                           f"send valid UTF-8.", param=str(where[0]) if where else None)
        return data


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16  # OpenAI's default for completions


class TextPart(APIModel):
    type: Literal["text"]
    text: str


class ChatMessage(APIModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # None: up to the model's context
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error object: every 4xx and 5xx of this server."""
    error: ErrorDetail


def validation_error(exc):
    """FastAPI's 422 for a body it cannot parse, as OpenAI's 400 with one sentence."""
    error = exc.errors()[0]
    union_member = lambda part: part in ("str", "int", "float", "bool") or "[" in part  # pydantic names the type it tried
    loc = [str(part) for part in error.get("loc", ())[1:] if not union_member(str(part))]  # and "body" comes first
    param = loc[0] if loc else None
    if error["type"] == "json_invalid":
        param = None
        message = f"The request body is not valid JSON ({error.get('ctx', {}).get('error', error['msg'])}): send a JSON object."
    elif not loc:
        message = f"The request body must be a JSON object with the request's parameters ({error['msg']})."
    elif error["type"] == "missing":
        message = f"Missing required parameter: '{'.'.join(loc)}'."
    else:
        message = f"Invalid value for '{'.'.join(loc)}': {error['msg']}."
    return APIError(message, param=param)
