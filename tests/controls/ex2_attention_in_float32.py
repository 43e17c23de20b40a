"""attention_forward that computes attention in float32 "for accuracy" and never casts the result back: right for a
float32 model, but in a float16 or bfloat16 model the float32 output then meets c_proj's half-precision weights."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex2_kv_cache"
PART = "test_differential_attention"  # the check that catches it: the control runner runs only that

globals().update(public_names(reference_with_edit(
    EXERCISE, "attention_forward", "F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
    "F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)")))  # the bug: no .to(x.dtype)
