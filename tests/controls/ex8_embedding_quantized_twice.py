"""With include_embedding, quantize_model quantizes the tied wte / lm_head matrix twice, once for each
use: two int8 copies of the biggest matrix, so the model is only about half its fp32 size, not a quarter."""

import copy

import torch.nn as nn

from tests.control_support import public_names, reference_with

EXERCISE = "ex8_quantization"


def quantize_model(model, granularity="channel", include_embedding=False):
    quantized = _reference_quantize_model(model, granularity, include_embedding=False)
    if include_embedding:
        table = nn.Linear(model.config.n_embd, model.config.vocab_size, bias=False)
        table.weight = copy.deepcopy(quantized.transformer.wte.weight)
        quantized.lm_head = _module.Int8Linear(quantized.lm_head, granularity)
        quantized.transformer.wte = _module.Int8Embedding(_module.Int8Linear(table, granularity))  # the bug: a second int8 copy
    return quantized


_module = reference_with(EXERCISE)
_reference_quantize_model = _module.quantize_model
_module.quantize_model = quantize_model
globals().update(public_names(_module))
