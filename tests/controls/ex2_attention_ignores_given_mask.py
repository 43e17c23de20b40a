"""attention_forward builds its own causal mask instead of using the `mask` it is given: right for one
sequence, but the pads of a left-padded batch (exercises 3 and 4) stay visible to every query."""

import torch.nn.functional as F

from tests.control_support import public_names, reference_with

EXERCISE = "ex2_kv_cache"
PART = "test_forward_hides_the_keys_the_mask_hides"  # the check that catches it: the control runner runs only that


def attention_forward(attn, x, kv_cache, layer, mask):
    B, T, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
    k, v = kv_cache.update(layer, k, v)
    own = _module.causal_mask(T, k.shape[2], x.device)  # the bug: `mask` (with the padding) is never read
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=own)
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


_module = reference_with(EXERCISE, attention_forward=attention_forward)
globals().update(public_names(_module))
