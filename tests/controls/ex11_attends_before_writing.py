"""decode_step attends first and writes the new key and value afterwards: each token misses itself."""

import torch
import torch.nn.functional as F

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11b_decode_step_equals_exercise_5s_forward"

base = reference_with(EXERCISE)


@torch.no_grad()
def decode_step(model, cache, inputs, size, width):
    ids, positions, slots = inputs.input_ids[:size], inputs.positions[:size], inputs.slots[:size]
    tables = inputs.block_tables[:size, :width]
    mask = torch.arange(width * cache.keys[0].shape[1], device=ids.device) < inputs.context_lens[:size, None]
    transformer = model.transformer
    x = transformer.wte(ids) + transformer.wpe(positions)
    C = x.shape[-1]
    for layer, block in enumerate(transformer.h):
        attn = block.attn
        q, k, v = (t.view(size, attn.n_head, C // attn.n_head) for t in attn.c_attn(block.ln_1(x)).split(C, dim=1))
        keys, values = (pool[tables].flatten(1, 2).transpose(1, 2) for pool in (cache.keys[layer], cache.values[layer]))
        y = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask[:, None, None])
        cache.write(layer, k, v, slots)  # the bug: after attending
        x = x + attn.c_proj(y.reshape(size, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(transformer.ln_f(x))


base.decode_step = decode_step
globals().update(public_names(base))
