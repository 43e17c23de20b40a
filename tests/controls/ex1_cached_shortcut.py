"""'Naive' generate that secretly uses a KV cache: right tokens, but not the O(n^2) cost the exercise teaches."""

from solutions.ex2_kv_cache import generate  # noqa: F401

EXERCISE = "ex1_generate"
