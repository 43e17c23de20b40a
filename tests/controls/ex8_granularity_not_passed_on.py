"""quantize_model does not pass its granularity on: every Int8Linear is built with its default, so
quantize_model(model, "tensor") or quantize_model(model, 32) silently quantizes per channel (a per-tensor
or per-group experiment then measures per channel without saying so)."""

import copy

import torch.nn as nn

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"
PART = "test_8c_quantize_model_replaces_every_linear"  # the check that catches it


def quantize_model(model, granularity="channel", include_embedding=False):
    if include_embedding and granularity == "tensor":
        raise ValueError("include_embedding=True needs scales per row.")
    quantized = copy.deepcopy(model)
    for block in quantized.transformer.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _module.Int8Linear(child))  # the bug: the granularity is dropped
    if include_embedding:
        quantized.lm_head = _module.Int8Linear(quantized.lm_head)
        quantized.transformer.wte = _module.Int8Embedding(quantized.lm_head)
    return quantized


_module = reference_with(EXERCISE, quantize_model=quantize_model)
globals().update(public_names(_module))
