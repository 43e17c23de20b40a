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

Your part, in three pieces graded on their own:
  8a  stored_value, round_to_bfloat16
  8b  quantize_per_tensor, quantize_per_channel, quantize_per_group, dequantize,
      quantize_asymmetric, dequantize_asymmetric
  8c  Int8Linear.__init__ and .forward, Int8Embedding.forward, quantize_model
  (quantize(), which picks a granularity, Int8Linear.weight and the input checks are given.)
Stuck? exercises/hints/ex8.md has hints for each TODO, from the idea to near-code: open one at a time.
Check your work with:  pytest exercises/test_ex8_quantization.py   (-k 8a, -k 8b or -k 8c for one part)
"""

import copy  # noqa: F401 (for your quantize_model)

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401 (for your Int8Linear.forward)

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
    # TODO (exercise 8a): the contract is the docstring: the value exactly as torch.tensor(x, dtype=dtype)
    # holds it, read back as a Python float, and its bit pattern as upper-case hex, 4 digits for 16 bits and
    # 8 for 32 (zero-padded: 0.0001 in float16 is "068E"). The trap: reading the bits as a signed integer
    # gives a negative number for negative x; the hex of the bits has no minus sign (the sign is the top bit).
    raise NotImplementedError("Exercise 8: implement stored_value() in exercises/ex8_quantization.py: store x in dtype, "
                              "read the value back and the bits as hex.")


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
    # TODO (exercise 8a): work on the bits (x.view(torch.int32)), not with .to(torch.bfloat16): returns a
    # bfloat16 tensor of x's shape whose bits equal torch's .to(torch.bfloat16) for "nearest" and float32's
    # upper 16 bits for "truncate". The traps of "nearest": an exact tie (the dropped half is exactly 0x8000)
    # goes to the neighbour whose last kept bit is 0 (ties to even), and a round-up may carry into the
    # exponent (1.9999999 -> 2.0, the largest float32 -> inf): integer addition does that for you.
    raise NotImplementedError("Exercise 8: implement round_to_bfloat16() in exercises/ex8_quantization.py: keep the upper "
                              "16 bits of each float32, rounded to nearest even or truncated.")


# ----------------------------------------------------------------------------------------------
# 8b: quantizing a tensor


def quantize_per_tensor(w):
    """Symmetric absmax int8 with ONE scale for the whole 2-D tensor w [rows, cols]:
    scale = max|w| / 127, q = round(w / scale) in -127..127. Returns (q int8 [rows, cols], scale
    float32 [1, 1]); dequantize(q, scale) gives w back to within scale / 2."""
    _check_weight(w)
    # TODO (exercise 8b): the contract is the docstring. q = round(w / scale) to the NEAREST integer (not
    # truncated towards zero: that doubles the error), clamped to -127..127 (not -128: symmetric means w and
    # -w give q and -q). The scale is float32 [1, 1], so that dequantize() reads every granularity alike.
    # An all-zero tensor has an absmax of 0: give it a scale that is not 0 (q is 0 anyway), never NaN.
    raise NotImplementedError("Exercise 8: implement quantize_per_tensor() in exercises/ex8_quantization.py: one absmax "
                              "scale for the whole tensor, q = round(w / scale) in -127..127.")


def quantize_per_channel(w):
    """Symmetric absmax int8 with one scale per OUTPUT channel: a Linear's weight is [out, in], and
    row o holds the weights of output o, so each row gets scale[o] = max|w[o, :]| / 127.
    Returns (q int8 [out, in], scale float32 [out, 1])."""
    _check_weight(w)
    # TODO (exercise 8b): as quantize_per_tensor, but the absmax is taken over each ROW of w [out, in]
    # (row o = the weights of output o: an output channel), so scale is float32 [out, 1]. The trap: the
    # absmax over dim 0 gives one scale per INPUT column instead, which does not protect a row from another
    # row's outlier (and does not match the [out, 1] shape).
    raise NotImplementedError("Exercise 8: implement quantize_per_channel() in exercises/ex8_quantization.py: one absmax "
                              "scale per output channel (row), q = round(w / scale) in -127..127.")


def quantize_per_group(w, group_size):
    """Symmetric absmax int8 with one scale per group of `group_size` consecutive weights of a row
    (the input dimension is cut into in / group_size groups; it must divide).
    Returns (q int8 [out, in], scale float32 [out, in // group_size])."""
    _check_weight(w)
    if not isinstance(group_size, int) or group_size < 1 or w.shape[1] % group_size:
        raise ValueError(f"group_size={group_size!r} does not divide the {w.shape[1]} input columns: pick a divisor of {w.shape[1]}.")
    # TODO (exercise 8b): as quantize_per_channel, but each row is cut into in // group_size groups of
    # group_size consecutive weights, each with its own absmax scale: q int8 [out, in], scale float32
    # [out, in // group_size]. group_size = in is exactly per channel.
    raise NotImplementedError("Exercise 8: implement quantize_per_group() in exercises/ex8_quantization.py: one absmax "
                              "scale per group of group_size weights of a row.")


def dequantize(q, scale):
    """int8 q [out, in] and the scale of any granularity above ([1, 1], [out, 1] or [out, groups])
    -> float32 [out, in], each weight q * its own scale."""
    # TODO (exercise 8b): float32 [out, in], each integer times ITS scale: scale [1, 1] is one for all,
    # [out, 1] one per row, [out, groups] one per group of in // groups consecutive columns of a row.
    raise NotImplementedError("Exercise 8: implement dequantize() in exercises/ex8_quantization.py: q times the scale "
                              "of its tensor, row or group, as float32.")


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
    # TODO (exercise 8b): the contract is the docstring (it is what torch.ao's quint8 observer and
    # torch.quantize_per_tensor do, and the checker compares with them). The trap: take the range over the
    # values AND 0 (min(x, 0), max(x, 0)); without 0 in it, 0 is not stored exactly and an all-positive
    # tensor gets a zero point outside 0..255. The scale is a float32 0-d tensor, the zero point a Python int.
    raise NotImplementedError("Exercise 8: implement quantize_asymmetric() in exercises/ex8_quantization.py: scale and "
                              "zero point from [min(x, 0), max(x, 0)], Q = round(x / scale) + Z in 0..255.")


def dequantize_asymmetric(q, scale, zero_point):
    """uint8 Q -> float32 (Q - Z) * scale."""
    # TODO (exercise 8b): float32, (Q - Z) * scale. The trap: Q is uint8; subtract in a signed or float type.
    raise NotImplementedError("Exercise 8: implement dequantize_asymmetric() in exercises/ex8_quantization.py: (Q - Z) * scale.")


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
        # TODO (exercise 8c): quantize the linear's weight with quantize(weight, granularity) (a bad
        # granularity raises ValueError there) and keep, as BUFFERS (self.register_buffer: they follow .to()
        # and the state dict, and nothing trains them): weight_int8 (int8 [out, in]), scale (float32) and
        # bias (a float copy of linear.bias, or None). No float copy of the weight may stay in this module
        # (that is the memory saved), and the given linear stays exactly as it was (detach; never write into it).
        raise NotImplementedError("Exercise 8: implement Int8Linear.__init__() in exercises/ex8_quantization.py: store the "
                                  "int8 weight, its scales and the bias as buffers.")

    def forward(self, x):
        # TODO (exercise 8c): the contract: the same as nn.Linear's forward, x [..., in] -> [..., out], with
        # the weight the dequantized int8 one (in x's dtype) and the float bias added (when there is one).
        # Dequantize here, on every call: between calls only the int8 matrix is kept.
        raise NotImplementedError("Exercise 8: implement Int8Linear.forward() in exercises/ex8_quantization.py: dequantize "
                                  "the int8 weight, then a Linear's matmul plus bias.")

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
        # TODO (exercise 8c): the contract: input_ids [...] -> float32 [..., n_embd], the rows input_ids of
        # the dequantized matrix of self.int8_linear (its weight_int8 and scale), as nn.Embedding would give
        # them from the float matrix. Dequantize only the rows asked for (50,257 rows of which a step needs a
        # few), each with its own scales: scale [vocab, groups] has a row per token, scale [1, 1] one for all.
        raise NotImplementedError("Exercise 8: implement Int8Embedding.forward() in exercises/ex8_quantization.py: look up "
                                  "the int8 rows of the ids and dequantize them with their scales.")

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
    # TODO (exercise 8c): the contract is the docstring; the traps:
    #   - the caller keeps using the fp32 model (to compare): work on a copy, never replace its modules.
    #   - every Linear of every block (4 per block in gpt.py), each replaced by an Int8Linear at `granularity`:
    #     the granularity asked for reaches every layer ("tensor" and group sizes too, not only the default).
    #   - include_embedding: wte and lm_head are ONE tied matrix [vocab, n_embd]. Quantizing it twice would
    #     store two int8 copies; quantize it once, as lm_head (per row = per token), and let wte read it.
    #   - without include_embedding, wte / lm_head stay the tied float matrix.
    raise NotImplementedError("Exercise 8: implement quantize_model() in exercises/ex8_quantization.py: a copy of the "
                              "model with every block's Linear an Int8Linear (and the tied matrix, as an option).")


def _float_format(dtype):
    dtype = FLOAT_FORMATS.get(dtype, dtype)
    if dtype not in FLOAT_FORMATS.values():
        raise ValueError(f"dtype={dtype!r}: use torch.float16, torch.bfloat16 or torch.float32.")
    return dtype
