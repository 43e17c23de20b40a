"""quantize_model swaps the Int8Linears into the model it is given and returns it: the caller's fp32
model is gone (and the fp32 vs int8 comparison compares the int8 model with itself)."""

import torch.nn as nn

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def quantize_model(model, granularity="channel", include_embedding=False):
    quantized = model  # the bug: no copy
    for block in quantized.transformer.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _module.Int8Linear(child, granularity))
    if include_embedding:
        quantized.lm_head = _module.Int8Linear(quantized.lm_head, granularity)
        quantized.transformer.wte = _module.Int8Embedding(quantized.lm_head)
    return quantized


_module = reference_with(EXERCISE, quantize_model=quantize_model)
globals().update(public_names(_module))
