"""Measuring a quantized model (module 8): shared by exercise 8's checker, notebooks/08_quantization.ipynb,
bench/quantization.py and the slides' figures.

    tensor_bytes(module)                the bytes its tensors really hold (shared storage counted once)
    heldout_ids(tokenizer)              the held-out Shakespeare text as GPT-2 token ids
    perplexity(model, ids, window)      exp(mean next-token cross-entropy) over windows of the text
    greedy_agreement(fp32, int8, ...)   how often the fp32 model would pick the int8 model's greedy token
    with_outlier(model, ...)            a copy of a model with one huge weight, for the LLM.int8() lesson
    matmul_errors(ex8, model, ...)      an int8 Linear's output error against torch.ao's dynamic int8 Linear

Nothing here quantizes: the callers pass exercise 8's module (the student's or the reference).
"""

import copy
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from workshop.serving.workloads import HELDOUT_TEXT

LINEAR_NAMES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # the four nn.Linear of a gpt.py block


def tensor_bytes(module):
    """Bytes held by a module's parameters and buffers, measured from the tensors: each storage once
    (GPT-2's tied wte / lm_head matrix, or an int8 matrix shared by two modules, counts once)."""
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        storage = t.untyped_storage()
        storages[storage.data_ptr(), t.device] = storage.nbytes()
    return sum(storages.values())


def heldout_ids(tokenizer):
    """The embedded models' held-out text (never trained on) as token ids."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # no warning that the text is longer than one context
    try:
        return tokenizer.encode(HELDOUT_TEXT.read_text())
    finally:
        transformers.logging.set_verbosity(verbosity)


@torch.no_grad()
def perplexity(model, ids, window=512, windows=None, starts=None):
    """exp(mean cross-entropy of each next token) over non-overlapping windows of `window` tokens of
    `ids`, each window scored from position 0 (as a request would see it). All the windows that fit by
    default, or the first `windows` of them, or those starting at `starts`."""
    if starts is None:
        starts = list(range(0, len(ids) - window, window))[:windows]
    total, count = 0.0, 0
    for start in starts:
        chunk = torch.tensor([ids[start:start + window + 1]], device=model.device)
        logits = model(chunk[:, :-1], torch.arange(window, device=model.device)[None])
        total += F.cross_entropy(logits[0].float(), chunk[0, 1:], reduction="sum").item()
        count += window
    return math.exp(total / count)


@dataclass
class Agreement:
    agreement: float  # share of the quantized model's greedy tokens the fp32 model would pick too
    identical: int  # continuations identical to the fp32 model's, token for token
    prompts: int
    tokens: int  # greedy tokens compared
    first_differences: list  # per prompt: index of the first new token that differs, or None


@torch.no_grad()
def greedy_agreement(fp32_model, quantized_model, prompts, max_new_tokens, generate):
    """Run greedy generation (`generate`, exercise 2's KV-cache one) with both models on every prompt.
    agreement: after each prefix of the QUANTIZED model's own continuation, does the fp32 model's
    argmax pick the same token? (One fp32 forward per prompt; unlike comparing the two continuations
    token by token, one near-tie flip does not make every later token count as a difference.)"""
    agree = tokens = identical = 0
    first = []
    for prompt in prompts:
        ours = generate(quantized_model, prompt, max_new_tokens, eos_token_id=-1)
        theirs = generate(fp32_model, prompt, max_new_tokens, eos_token_id=-1)
        ids = torch.tensor([list(prompt) + ours[:-1]], device=fp32_model.device)
        logits = fp32_model(ids, torch.arange(ids.shape[1], device=ids.device)[None])[0, len(prompt) - 1:]
        agree += (logits.argmax(-1).cpu() == torch.tensor(ours)).sum().item()
        tokens += len(ours)
        identical += ours == theirs
        first.append(next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None))
    return Agreement(agree / tokens, identical, len(prompts), tokens, first)


def with_outlier(model, layer=0, name="mlp.c_fc", factor=100.0, seed=0):
    """A copy of `model` in which ONE weight of block `layer`'s Linear `name` is `factor` times that
    matrix's largest |weight| (the kind of outlier LLM.int8() found in real models). Returns the copy
    and the (row, column) of the outlier."""
    model = copy.deepcopy(model)
    weight = model.transformer.h[layer].get_submodule(name).weight
    g = torch.Generator().manual_seed(seed)
    row, col = (torch.randint(0, n, (1,), generator=g).item() for n in weight.shape)
    with torch.no_grad():
        weight[row, col] = factor * weight.abs().max()
    return model, (row, col)


def linear_inputs(model, ids):
    """{(layer, name): (the nn.Linear, the activations it got)} for every Linear of every block, from
    one forward pass of the fp32 model over `ids` (a list of token ids)."""
    captured, hooks = {}, []
    for i, block in enumerate(model.transformer.h):
        for name in LINEAR_NAMES:
            module = block.get_submodule(name)
            hooks.append(module.register_forward_hook(
                lambda mod, args, out, key=(i, name): captured.__setitem__(key, (mod, args[0].detach()))))
    try:
        with torch.no_grad():
            x = torch.tensor([ids], device=model.device)
            model(x, torch.arange(len(ids), device=x.device)[None])
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def torch_dynamic_int8(linear, per_channel=True):
    """torch.ao's dynamic int8 Linear for `linear` (int8 weights per channel or per tensor, activations
    quantized to uint8 on the fly): the outside reference for the quantized matmul."""
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

        qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
        return quantize_dynamic(nn.Sequential(copy.deepcopy(linear).cpu()), {nn.Linear: qconfig}, dtype=torch.qint8)


def relative_error(got, expected):
    """||got - expected|| / ||expected|| (Frobenius)."""
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


@torch.no_grad()
def matmul_errors(ex8, model, ids, granularity="channel"):
    """Per Linear of the model: the relative output error of exercise 8's Int8Linear and of torch.ao's
    dynamic int8 Linear (per channel), both against the fp32 Linear, on the activations of `ids`."""
    rows = {}
    for (layer, name), (linear, x) in linear_inputs(model, ids).items():
        expected = linear(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ao = torch_dynamic_int8(linear)(x.cpu())
        rows[f"{layer}.{name}"] = {"int8_weight_only": relative_error(ex8.Int8Linear(linear, granularity)(x), expected),
                                   "torch_ao_dynamic": relative_error(ao, expected.cpu())}
    return rows
