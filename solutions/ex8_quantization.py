"""Exercise 8: int8 weight-only quantization.

A decode step reads every weight of the model once to produce one token: on a GPU it is bound by
memory bandwidth, not arithmetic, and a 4-byte float32 (or 2-byte float16) weight costs 4 (or 2)
times the traffic of a 1-byte int8 one. Weight-only quantization stores each weight matrix as int8
integers plus a few float scales, and turns them back into floats ("dequantizes") on the fly, inside
the layer, right before the matmul. The activations stay in floating point.

    symmetric (absmax)   scale = max|w| / 127,  q = round(w / scale) in -127..127,  w ~ q * scale
    asymmetric           scale = (max - min) / 255,  Q = round(r / scale) + Z in 0..255,  r ~ (Q - Z) * scale

How many weights share one scale (the granularity) decides how much one large weight hurts its
neighbours: per tensor (one scale), per output channel (one per row of a Linear's [out, in]
weight), per group (one per group_size consecutive weights of a row). LLM.int8() (Dettmers et al.,
2022) showed that real models have a few huge outliers: one of them makes a per-tensor scale so
coarse that most weights round to 0; per channel, only its own row pays.

The parts, each graded on its own (pytest exercises/test_ex8_quantization.py -k 8a, 8b, 8c):
  8a  number formats: a float's value and bits in float16 / bfloat16 / float32 (the course's table),
      and float32 -> bfloat16 by hand, rounding to nearest even against truncation
  8b  quantizing a tensor: symmetric absmax per tensor, per output channel and per group, dequantize;
      asymmetric with a zero point, for skewed values such as activations
  8c  the int8 Linear (int8 weights and scales stored, dequantized on the fly), the tied embedding,
      and quantizing every Linear of a gpt.py model
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt import check_token_ids

QMAX = 127  # symmetric int8 uses -127..127, so that +w and -w quantize to +q and -q
FLOAT_FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# ----------------------------------------------------------------------------------------------
# 8a: number formats


def stored_value(x, dtype):
    """The float `x` (a Python float) as the format `dtype` stores it (torch.float16, torch.bfloat16 or
    torch.float32, or their names): (value, bits), the value read back as a Python float and the bit
    pattern as upper-case hex, 4 digits for the 16-bit formats, 8 for float32.

    stored_value(0.0001, torch.float16) == (0.00010001659393310547, "068E")."""
    dtype = _float_format(dtype)
    stored = torch.tensor(x, dtype=dtype)
    width = stored.element_size() * 8
    bits = stored.view({16: torch.int16, 32: torch.int32}[width]).item() & ((1 << width) - 1)  # two's complement -> unsigned
    return stored.item(), f"{bits:0{width // 4}X}"


def round_to_bfloat16(x, mode="nearest"):
    """float32 tensor -> bfloat16 tensor, by hand on the bits. bfloat16 is the upper 16 bits of a
    float32 (sign, the same 8 exponent bits, 7 of the 23 mantissa bits), so converting means dropping
    the lower 16 bits: mode="truncate" just drops them (always towards zero); mode="nearest" rounds to
    the nearest bfloat16, ties to the one with an even last bit, as torch's .to(torch.bfloat16) does.
    Finite values and +-inf (no NaN); a value that rounds past bfloat16's largest becomes inf."""
    if mode not in ("nearest", "truncate"):
        raise ValueError(f"mode={mode!r}: use 'nearest' (round to nearest, ties to even) or 'truncate'.")
    if x.dtype != torch.float32:
        raise ValueError(f"round_to_bfloat16 takes a float32 tensor, got {x.dtype}: convert it with .float() first.")
    bits = x.view(torch.int32)
    if mode == "nearest":
        lsb = (bits >> 16) & 1  # the last bit that survives: ties go to where it is 0
        bits = bits + 0x7FFF + lsb  # a carry out of the low half rounds up (into the exponent if need be)
    return (bits >> 16).to(torch.int16).view(torch.bfloat16)  # the upper half; int32 -> int16 keeps the low 16 bits


# ----------------------------------------------------------------------------------------------
# 8b: quantizing a tensor


def quantize_per_tensor(w):
    """Symmetric absmax int8 with ONE scale for the whole 2-D tensor w [rows, cols]:
    scale = max|w| / 127, q = round(w / scale) in -127..127. Returns (q int8 [rows, cols], scale
    float32 [1, 1]); dequantize(q, scale) gives w back to within scale / 2."""
    _check_weight(w)
    return _absmax(w.reshape(1, 1, -1), w.shape)


def quantize_per_channel(w):
    """Symmetric absmax int8 with one scale per OUTPUT channel: a Linear's weight is [out, in], and
    row o holds the weights of output o, so each row gets scale[o] = max|w[o, :]| / 127.
    Returns (q int8 [out, in], scale float32 [out, 1])."""
    _check_weight(w)
    return _absmax(w.reshape(w.shape[0], 1, -1), w.shape)


def quantize_per_group(w, group_size):
    """Symmetric absmax int8 with one scale per group of `group_size` consecutive weights of a row
    (the input dimension is cut into in / group_size groups; it must divide).
    Returns (q int8 [out, in], scale float32 [out, in // group_size])."""
    _check_weight(w)
    if not isinstance(group_size, int) or group_size < 1 or w.shape[1] % group_size:
        raise ValueError(f"group_size={group_size!r} does not divide the {w.shape[1]} input columns: pick a divisor of {w.shape[1]}.")
    return _absmax(w.reshape(w.shape[0], -1, group_size), w.shape)


def _absmax(groups, shape):
    """groups [rows, n_groups, group]: each group's absmax scale, and the weights rounded to -127..127."""
    scale = groups.abs().amax(dim=-1, keepdim=True).float() / QMAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero group: any scale gives q = 0
    q = torch.round(groups / scale).clamp(-QMAX, QMAX).to(torch.int8)  # round half to even, as torch does
    return q.reshape(shape), scale.squeeze(-1)


def dequantize(q, scale):
    """int8 q [out, in] and the scale of any granularity above ([1, 1], [out, 1] or [out, groups])
    -> float32 [out, in], each weight q * its own scale."""
    n_groups = scale.shape[1]
    return (q.reshape(q.shape[0], n_groups, -1).float() * scale[..., None].float()).reshape(q.shape)  # float32 whatever the scale's dtype


def quantize_asymmetric(x):
    """Asymmetric (affine) 8-bit quantization of a tensor of any shape, for values that are not
    centred on zero (activations after a GELU, say): the range [min(x, 0), max(x, 0)] is mapped onto
    all 256 levels 0..255 of a uint8, as torch's quint8 does:
        scale = (hi - lo) / 255,  zero_point Z = round(-lo / scale) (the level of r = 0),
        Q = clamp(round(r / scale) + Z, 0, 255).
    The range always includes 0, so that 0 is stored exactly (zero padding, ReLU zeros).
    Returns (Q uint8, same shape as x; scale, a float32 0-d tensor; zero_point, a Python int)."""
    if not x.is_floating_point() or x.numel() == 0:
        raise ValueError(f"quantize_asymmetric takes a non-empty float tensor, got {x.dtype} with {x.numel()} elements.")
    lo, hi = x.min().float().clamp(max=0), x.max().float().clamp(min=0)
    scale = (hi - lo) / 255
    if scale == 0:  # all zeros
        scale = torch.ones_like(scale)
    zero_point = int(torch.round(-lo / scale).clamp(0, 255))
    q = (torch.round(x.float() / scale) + zero_point).clamp(0, 255).to(torch.uint8)
    return q, scale, zero_point


def dequantize_asymmetric(q, scale, zero_point):
    """uint8 Q -> float32 (Q - Z) * scale."""
    return (q.float() - zero_point) * scale


def _check_weight(w):
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        what = f"a {w.dim()}-D {w.dtype} tensor" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"expected a 2-D float weight [out, in] (a Linear's .weight), got {what}.")


# ----------------------------------------------------------------------------------------------
# 8c: the int8 Linear and the quantized model

def quantize(w, granularity="channel"):
    """(q, scale) of w at a granularity: "tensor", "channel", or an int group size."""
    if granularity == "tensor":
        return quantize_per_tensor(w)
    if granularity == "channel":
        return quantize_per_channel(w)
    if isinstance(granularity, int) and not isinstance(granularity, bool):
        return quantize_per_group(w, granularity)
    raise ValueError(f"granularity={granularity!r}: use 'tensor', 'channel' or an int group size.")


class Int8Linear(nn.Module):
    """A drop-in replacement for an nn.Linear whose weight is stored as int8 plus float32 scales (at
    the given granularity: "tensor", "channel" or an int group size) and dequantized on the fly in
    forward; the bias stays float. It keeps three buffers, which Int8Embedding and `weight` read:
    weight_int8 (int8 [out, in]), scale (float32, as quantize() returns it) and bias (or None).
    The given Linear is left as it was. `weight` dequantizes, for code that reads a layer's .weight
    (gpt.py's model.device does)."""

    def __init__(self, linear, granularity="channel"):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"Int8Linear replaces an nn.Linear, got {type(linear).__name__}.")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize(linear.weight.detach(), granularity)
        self.register_buffer("weight_int8", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x):
        weight = dequantize(self.weight_int8, self.scale).to(x.dtype)  # int8 -> float, right before the matmul
        return F.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))

    @property
    def weight(self):
        return dequantize(self.weight_int8, self.scale)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, scales={tuple(self.scale.shape)}"


class Int8Embedding(nn.Module):
    """The token embedding read from a quantized, TIED output matrix: GPT-2's wte [vocab, n_embd] is
    also lm_head's weight, so once lm_head is an Int8Linear, the embedding looks up the rows of that
    same int8 matrix (and their scales) and dequantizes only the rows it needs. One int8 copy in memory."""

    def __init__(self, int8_linear):
        super().__init__()
        self.int8_linear = int8_linear  # shared with lm_head: its tensors count once

    def forward(self, input_ids):
        # given: ids outside the vocabulary are refused on the host (a CPU tensor's), as nn.Embedding refuses them: an
        # InvalidIndex is an IndexError too. Unchecked, a negative id would read the last rows, and a GPU would assert.
        check_token_ids(input_ids, self.int8_linear.weight_int8.shape[0], "input_ids")
        linear = self.int8_linear
        rows, scale = linear.weight_int8[input_ids], linear.scale  # [..., n_embd] int8
        row_scale = scale[input_ids] if scale.shape[0] > 1 else scale[0].expand(*input_ids.shape, -1)  # [..., groups]
        groups = rows.unflatten(-1, (scale.shape[1], -1)).float() * row_scale[..., None]
        return groups.reshape(rows.shape)

    @property
    def weight(self):
        return self.int8_linear.weight


def quantize_model(model, granularity="channel", include_embedding=False):
    """A copy of a gpt.py model (GPTLMHead) in which every nn.Linear of the transformer blocks
    (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) is an Int8Linear; with include_embedding=True the
    tied wte / lm_head matrix too, stored once: lm_head an Int8Linear, wte an Int8Embedding over it.
    The given model is left as it was (fp32, its own modules)."""
    if include_embedding and granularity == "tensor":
        raise ValueError("include_embedding=True needs scales per row ('channel' or a group size): one scale for the "
                         "whole 50,257-row embedding matrix would lose the rare tokens' rows.")
    quantized = copy.deepcopy(model)  # the tie wte / lm_head survives the copy
    for block in quantized.transformer.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Int8Linear(child, granularity))
    if include_embedding:
        quantized.lm_head = Int8Linear(quantized.lm_head, granularity)
        quantized.transformer.wte = Int8Embedding(quantized.lm_head)
    return quantized


def _float_format(dtype):
    dtype = FLOAT_FORMATS.get(dtype, dtype)
    if dtype not in FLOAT_FORMATS.values():
        raise ValueError(f"dtype={dtype!r}: use torch.float16, torch.bfloat16 or torch.float32.")
    return dtype
