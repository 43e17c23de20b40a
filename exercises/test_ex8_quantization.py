"""Checker for exercise 8, int8 weight-only quantization: pytest exercises/test_ex8_quantization.py (-k 8a, 8b, 8c)

What it grades, and the bounds it states:
  8a  the course's number-format table exactly (values and hex), any float as torch stores it, and
      float32 -> bfloat16 by hand (no torch conversion of a float to bfloat16 on the way) bit for bit equal
      to torch (round to nearest, ties to even) or truncated
  8b  every quantizer against torch.ao's observers and torch.quantize_per_* (same scales and zero
      points, same integers up to exact ties), round-trip error at most half a step everywhere, the
      symmetric range -127..127, the outlier lesson, and asymmetric beating symmetric on skewed values
      (its scale a float32 0-d tensor)
  8c  the int8 Linear stores int8 buffers (bytes measured from its tensors: at least 3.5x fewer than fp32,
      and no float weight kept after forward passes, which dequantize on every call in the input's dtype), its
      output error no larger than torch.ao's dynamic int8 Linear's; the embedding reads any granularity's
      scales (one for all too) and dequantizes only the rows asked for; quantize_model at every granularity
      (per tensor, per channel, a seeded group size) holds each layer's weight quantized at THAT
      granularity, and computes the logits of those int8 weights; the quantized tiny model has
      perplexity within 1% of the fp32 model's on held-out text, and the fp32 model picks the same
      greedy token as the int8 model (run by exercise 2's KV-cache generate) at least 90% of the time
"""

import copy
import math
import random
import struct
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import solutions.ex2_kv_cache as ex2
import solutions.ex8_quantization as reference
from workshop.grading.device_audit import on_device
from workshop.grading.harness import implementation, paired_timing
from workshop.quantization import (LINEAR_NAMES, greedy_agreement, heldout_ids, linear_inputs, perplexity, relative_error,
                                   tensor_bytes, torch_dynamic_int8)
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex8.md"
# The course's table: value as stored, and its bits. None: the format cannot hold it (0 or inf).
COURSE_TABLE = {  # x: {format: (value written as the course writes it, hex)}
    0.0001: {"float16": ("0.00010001659393", "068E"), "bfloat16": ("0.00010013580322", "38D2")},
    1e-08: {"float16": ("0", "0000"), "bfloat16": ("1.001172e-08", "322C")},
    100000.00001: {"float16": ("inf", "7C00"), "bfloat16": ("99840", "47C3")},
}
FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
PERPLEXITY_BOUND = 1.01  # the int8 model's perplexity at most 1% above the fp32 model's
AGREEMENT_BOUND = 0.90  # the fp32 model picks the int8 model's greedy token at least 90% of the time
BYTES_BOUND = 3.5  # int8 weights: at least 3.5x fewer bytes than fp32 (4x for the matrices, less the scales)


@pytest.fixture(scope="module")
def student():
    return implementation("ex8_quantization")


@pytest.fixture(autouse=True)
def quiet_torch_ao():
    with warnings.catch_warnings():  # torch.ao.quantization warns that it is deprecated (in favour of torchao)
        warnings.simplefilter("ignore")
        yield


def weights(seed, rows=None, cols=None):
    """A seeded 2-D weight whose rows differ in size by up to four orders of magnitude (as real layers'
    rows do, less extremely), with the columns a multiple of 8 so that groups fit."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    rows, cols = rows or rng.randint(3, 40), cols or 8 * rng.randint(2, 16)
    magnitudes = torch.logspace(-3, 1, rows)[torch.randperm(rows, generator=g)]
    return torch.randn(rows, cols, generator=g) * magnitudes[:, None]


def check_rounding(q, w, scale, what, hint):
    """q must be round(w / scale), clamped to -127..127 (either neighbour at an exact tie)."""
    exact = w.double() / scale.double()
    expected = exact.round().clamp(-127, 127)
    tie = (exact - exact.floor() - 0.5).abs() < 1e-4
    wrong = (q.double() != expected) & ~(tie & ((q.double() - exact).abs() <= 0.5 + 1e-4))
    if wrong.any():
        i = tuple(wrong.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(wrong.sum())} of {q.numel()} integers are not round(w / scale); first at {i}: "
                             f"w = {w[i].item():.6g}, w / scale = {exact[i].item():.4f}, got q = {int(q[i])}, expected "
                             f"{int(expected[i])} (round to the NEAREST integer, then clamp to -127..127; {hint}).")


def check_symmetric(student, q, scale, w, scale_shape, expected_scale, what, hint):
    """dtype, shapes, the scale, the rounding, the range, dequantize and the half-step bound."""
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and q.shape == w.shape, (
        f"{what}: q should be an int8 tensor of w's shape {tuple(w.shape)}, got "
        f"{q.dtype if isinstance(q, torch.Tensor) else type(q).__name__} {tuple(getattr(q, 'shape', ()))} ({hint}).")
    assert isinstance(scale, torch.Tensor) and tuple(scale.shape) == scale_shape and scale.dtype == torch.float32, (
        f"{what}: scale should be a float32 tensor of shape {scale_shape}, got "
        f"{getattr(scale, 'dtype', type(scale).__name__)} {tuple(getattr(scale, 'shape', ()))} ({hint}).")
    close = torch.isclose(scale, expected_scale, rtol=1e-5, atol=0)
    if not close.all():
        i = tuple((~close).nonzero()[0].tolist())
        raise AssertionError(f"{what}: scale{list(i)} is {scale[i].item():.6g}, expected max|w| / 127 = {expected_scale[i].item():.6g} over "
                             f"its weights (ratio {scale[i].item() / expected_scale[i].item():.4f}; {hint}).")
    assert int(q.min()) >= -127 and int(q.max()) <= 127, (
        f"{what}: q spans {int(q.min())}..{int(q.max())}; symmetric int8 uses -127..127 only, so that w and -w quantize to q "
        f"and -q and zero sits in the middle (-128 has no +128 twin; see {HINTS}, quantize_per_tensor, hint 1).")
    check_rounding(q, w, expand(scale, w.shape), what, hint)
    back = student.dequantize(q, scale)
    assert isinstance(back, torch.Tensor) and back.shape == w.shape and back.dtype == torch.float32, (
        f"dequantize(q, scale) should give a float32 tensor of shape {tuple(w.shape)}, got "
        f"{getattr(back, 'dtype', type(back).__name__)} {tuple(getattr(back, 'shape', ()))} (see {HINTS}, dequantize).")
    by_hand = q.float() * expand(scale, w.shape)
    assert torch.allclose(back, by_hand, rtol=1e-6, atol=0), (
        f"dequantize(q, scale) differs from q * (each weight's own scale) by up to {(back - by_hand).abs().max().item():.3g}: "
        f"scale {tuple(scale.shape)} holds one scale per {'group of ' if scale.shape[1] > 1 else ''}row (see {HINTS}, dequantize, hint 2).")
    step = expand(scale, w.shape)
    over = (back - w).abs() > step / 2 * (1 + 1e-5) + 1e-30
    assert not over.any(), (f"{what}: the round trip misses w by more than half a step (scale / 2) at {int(over.sum())} weights, "
                            f"e.g. {((back - w).abs() / step).max().item():.2f} steps ({hint}).")


def expand(scale, shape):
    """Each weight's own scale, [out, in], from a scale of shape [1, 1], [out, 1] or [out, groups]."""
    groups = scale.shape[1]
    return scale.repeat_interleave(shape[1] // groups, dim=1).expand(shape)


def torch_symmetric(w, per_channel):
    """torch.ao's observer and torch.quantize_per_*: scales over -127..127, and the integers."""
    from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

    if per_channel:
        observer = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-127, quant_max=127)
        observer(w)
        scale, zero = observer.calculate_qparams()
        return scale, torch.quantize_per_channel(w, scale, zero, 0, torch.qint8).int_repr()
    observer = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-127, quant_max=127)
    observer(w)
    scale, zero = observer.calculate_qparams()
    return scale, torch.quantize_per_tensor(w, scale.item(), int(zero), torch.qint8).int_repr()


# ----------------------------------------------------------------------------------------------
# 8a: number formats

def test_8a_the_course_table(student):
    """0.0001, 1e-08 and 100000.00001 in float16 and bfloat16, exactly as the course's table shows them."""
    for x, row in COURSE_TABLE.items():
        for name, (written, bits) in row.items():
            for dtype in (FORMATS[name], name):
                got = student.stored_value(x, dtype)
                assert isinstance(got, tuple) and len(got) == 2, f"stored_value({x}, {dtype}) should return (value, hex), got {got!r}."
                value, hex_bits = got
                shown = f"{value:.14f}".rstrip("0") if written.startswith("0.0") else f"{value:.7g}" if "e" in written else f"{value:g}"
                assert isinstance(value, float) and shown == written and hex_bits == bits, (
                    f"stored_value({x}, {dtype!r}) gave ({value!r}, {hex_bits!r}); the course's table says {written} with bits {bits} "
                    f"(see {HINTS}, stored_value, hint 2).")
        bits32 = struct.pack(">f", x).hex().upper()  # Python's own float32 packing, the outside reference
        got = student.stored_value(x, torch.float32)[1]
        assert got == bits32, f"stored_value({x}, torch.float32) bits are {got!r}, expected {bits32} (8 hex digits for 32 bits)."


def test_8a_stored_value_matches_torch(student, seed):
    """Any float, both signs, from 1e-9 to 1e6, as torch stores it; float16 bits also against Python's struct."""
    rng = random.Random(seed)
    xs = [rng.choice([-1, 1]) * rng.uniform(1, 10) * 10.0 ** rng.randint(-9, 6) for _ in range(60)] + [0.0, -2.0, 65504.0, 70000.0]
    for x in xs:
        for name, dtype in FORMATS.items():
            stored = torch.tensor(x, dtype=dtype)
            width = stored.element_size() * 8
            expected = (stored.item(), f"{stored.view({16: torch.int16, 32: torch.int32}[width]).item() & ((1 << width) - 1):0{width // 4}X}")
            got = student.stored_value(x, dtype)
            assert tuple(got) == expected, (f"stored_value({x!r}, torch.{name}) gave {tuple(got)!r}, expected {expected!r}: the value "
                                            f"read back as a Python float and the bit pattern as {width // 4} upper-case hex digits "
                                            f"(a negative number's sign bit is the top bit, not a minus sign; see {HINTS}, stored_value, hint 2).")
        if abs(x) <= 65504:  # Python packs float16 too (and raises OverflowError where float16 has inf)
            assert student.stored_value(x, "float16")[1] == struct.pack(">e", x).hex().upper(), (
                f"stored_value({x!r}, 'float16') bits differ from Python's struct.pack('>e', x).")


def bit_patterns(seed):
    """Seeded float32 bit patterns: random ones, and the hard cases (exact ties with an even and an odd
    last kept bit, carries into the exponent, the largest float32, subnormals, zeros, infinities)."""
    g = torch.Generator().manual_seed(seed)
    upper = torch.randint(0, 1 << 16, (4000,), generator=g, dtype=torch.int64)
    lower = torch.randint(0, 1 << 16, (4000,), generator=g, dtype=torch.int64)
    lower[:1000] = 0x8000  # exact ties
    lower[1000:1500] = 0x7FFF
    lower[1500:2000] = 0x8001
    special = torch.tensor([0x3F7FFFFF, 0x3F7F8000, 0x3F808000, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x00008000,
                            0x00018000, 0x007FFFFF, 0, 0x80000000, 0x7F800000, 0xFF800000, 0xBF808000, 0xBF818000, 0x38D1B717])
    bits = torch.cat([(upper << 16) | lower, special])
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)  # unsigned -> int32 two's complement
    x = bits.view(torch.float32)
    return x[~torch.isnan(x)]


def first_bit_difference(got, expected, x):
    wrong = (got != expected).nonzero()
    i = wrong[0].item()
    u32 = x.view(torch.int32)[i].item() & 0xFFFFFFFF
    return (f"{len(wrong)} of {len(x)} values differ; first: x = {x[i].item():.9g} (float32 bits {u32:08X}, low half "
            f"{u32 & 0xFFFF:04X}), got bfloat16 {got[i].item() & 0xFFFF:04X}, expected {expected[i].item() & 0xFFFF:04X}")


def test_8a_bfloat16_rounds_to_nearest_even(student, seed):
    """float32 -> bfloat16 by hand, bit for bit as torch's .to(torch.bfloat16): ties to even, carries
    into the exponent, rounding past the largest bfloat16 to inf."""
    x = bit_patterns(seed)
    got = student.round_to_bfloat16(x.clone(), "nearest")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got.shape == x.shape, (
        f"round_to_bfloat16 should return a bfloat16 tensor of shape {tuple(x.shape)}, got {getattr(got, 'dtype', type(got).__name__)} "
        f"{tuple(getattr(got, 'shape', ()))} (see {HINTS}, round_to_bfloat16, hint 2).")
    got_bits, expected_bits = got.view(torch.int16), x.to(torch.bfloat16).view(torch.int16)
    assert torch.equal(got_bits, expected_bits), (
        f"round_to_bfloat16(x, 'nearest') differs from torch's x.to(torch.bfloat16): {first_bit_difference(got_bits, expected_bits, x)}. "
        f"Round to nearest: add half of the dropped part's weight before dropping it; at an exact tie (low half 8000) keep the "
        f"result's last bit even (see {HINTS}, round_to_bfloat16, hints 1-3).")
    assert torch.equal(student.round_to_bfloat16(x.clone()).view(torch.int16), expected_bits), "mode='nearest' is the default."


def test_8a_truncation_drops_the_low_bits(student, seed):
    """mode='truncate' keeps the upper 16 bits: always towards zero, up to one whole bfloat16 step off,
    where rounding is at most half a step off (0.0001: 38D1 truncated, 38D2 rounded, as the course's table)."""
    x = bit_patterns(seed)
    got = student.round_to_bfloat16(x.clone(), "truncate").view(torch.int16)
    expected = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(got, expected), (f"round_to_bfloat16(x, 'truncate') should keep float32's upper 16 bits: "
                                        f"{first_bit_difference(got, expected, x)} (see {HINTS}, round_to_bfloat16, hint 2).")
    course = torch.tensor([0.0001])
    pair = [student.round_to_bfloat16(course, mode).view(torch.int16).item() & 0xFFFF for mode in ("truncate", "nearest")]
    assert pair == [0x38D1, 0x38D2], f"0.0001 (float32 bits 38D1B717) should give 38D1 truncated and 38D2 rounded, got {pair[0]:04X} and {pair[1]:04X}."
    with pytest.raises(ValueError):
        student.round_to_bfloat16(x.double(), "nearest")  # the bits of a float64 are not a float32's
    with pytest.raises(ValueError):
        student.round_to_bfloat16(x, "floor")


class _RecordTensors(TorchFunctionMode):
    """Every torch operation inside: its name, its tensor inputs and its tensor result (for the checks that see how a
    result was made, not only what it is)."""

    def __init__(self):
        super().__init__()
        self.ops = []  # (name, input tensors, result tensors)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs = [t for t in [*args, *(kwargs or {}).values()] if isinstance(t, torch.Tensor)]
        results = [t for t in (result if isinstance(result, (tuple, list)) else [result]) if isinstance(t, torch.Tensor)]
        if results:
            self.ops.append((getattr(func, "__name__", repr(func)), inputs, results))
        return result


def test_8a_bfloat16_by_hand_not_by_torch(student, seed):
    """round_to_bfloat16 works on the bits: no torch operation turns a float32 (or any other float) into a bfloat16 on
    its way (.to(torch.bfloat16), .bfloat16(), a copy_ into a bfloat16 tensor). Reinterpreting bits with .view is fine."""
    x = bit_patterns(seed)[:600]
    for mode in ("nearest", "truncate"):
        with _RecordTensors() as record:
            student.round_to_bfloat16(x.clone(), mode)
        conversions = sorted({name for name, inputs, results in record.ops if name != "view"
                              and any(t.dtype == torch.bfloat16 for t in results)
                              and any(t.is_floating_point() and t.dtype != torch.bfloat16 for t in inputs)})
        assert not conversions, (
            f"round_to_bfloat16(x, {mode!r}) let torch convert floats to bfloat16 ({', '.join(conversions)}): the exercise is "
            f"to do it by hand, on the bits of x.view(torch.int32), and build the bfloat16 result from its upper 16 bits "
            f"(see {HINTS}, round_to_bfloat16, hint 2).")


# ----------------------------------------------------------------------------------------------
# 8b: quantizing a tensor

def test_8b_per_tensor_round_trip(student, seed):
    """One scale for the whole tensor: max|w| / 127, integers in -127..127, the same as torch.ao's
    per-tensor symmetric observer and torch.quantize_per_tensor; an all-zero tensor stays zero."""
    hint = f"see {HINTS}, quantize_per_tensor"
    for k in range(3):
        w = weights(seed + k)
        q, scale = student.quantize_per_tensor(w)
        check_symmetric(student, q, scale, w, (1, 1), w.abs().max().reshape(1, 1) / 127, f"quantize_per_tensor on a {tuple(w.shape)} weight", hint)
        ao_scale, ao_q = torch_symmetric(w, per_channel=False)
        assert torch.allclose(scale.flatten(), ao_scale.float(), rtol=1e-5), f"scale {scale.item():.6g}, torch.ao's observer says {ao_scale.item():.6g}."
        check_rounding(ao_q, w, expand(scale, w.shape), "torch.quantize_per_tensor (the outside reference, with your scale)", hint)
    zero = torch.zeros(4, 8)
    q, scale = student.quantize_per_tensor(zero)
    back = student.dequantize(q, scale)
    assert torch.isfinite(scale).all() and not q.any() and not back.any(), (
        f"an all-zero tensor should quantize to q = 0 with a finite scale and come back as zeros, got scale {scale.flatten().tolist()} "
        f"(max|w| / 127 is 0 here: dividing by it gives NaN; {hint}, hint 2).")


def test_8b_per_channel_round_trip(student, seed):
    """One scale per OUTPUT channel (row of [out, in]): each row keeps its own precision, the same
    scales and integers as torch.ao's per-channel symmetric observer and torch.quantize_per_channel."""
    hint = f"see {HINTS}, quantize_per_channel"
    for k in range(3):
        w = weights(seed + 10 + k)
        q, scale = student.quantize_per_channel(w)
        check_symmetric(student, q, scale, w, (w.shape[0], 1), w.abs().amax(dim=1, keepdim=True) / 127,
                        f"quantize_per_channel on a {tuple(w.shape)} weight (output channels are rows)", hint)
        ao_scale, ao_q = torch_symmetric(w, per_channel=True)
        assert torch.allclose(scale.flatten(), ao_scale.float(), rtol=1e-5), "the scales differ from torch.ao's per-channel observer's."
        check_rounding(ao_q, w, expand(scale, w.shape), "torch.quantize_per_channel", hint)
        back = student.dequantize(q, scale)
        worst = ((back - w).norm(dim=1) / w.norm(dim=1)).max().item()
        assert worst < 0.02, (f"per channel, every row should keep about 2 decimal digits whatever its size, but one row's relative error "
                              f"is {worst:.3f} ({hint}).")


def test_8b_per_group_round_trip(student, seed):
    """One scale per group of group_size consecutive weights of a row: scale [out, in / group_size];
    group_size = in is per channel; a group_size that does not divide in is refused."""
    rng = random.Random(seed)
    hint = f"see {HINTS}, quantize_per_group"
    w = weights(seed + 20)
    cols = w.shape[1]
    for group_size in sorted({1, 8, rng.choice([d for d in range(2, cols) if cols % d == 0]), cols}):
        q, scale = student.quantize_per_group(w, group_size)
        groups = w.reshape(w.shape[0], cols // group_size, group_size)
        check_symmetric(student, q, scale, w, (w.shape[0], cols // group_size), groups.abs().amax(dim=-1) / 127,
                        f"quantize_per_group(w {tuple(w.shape)}, group_size={group_size})", hint)
    per_channel = student.quantize_per_channel(w)
    assert torch.equal(q, per_channel[0]) and torch.allclose(scale, per_channel[1]), "group_size = in should be per channel exactly."
    with pytest.raises(ValueError):
        student.quantize_per_group(w, cols + 1)


def test_8b_outlier_ruins_per_tensor_not_per_channel(student, model, seed):
    """LLM.int8()'s lesson on a real weight of the tiny model: one weight 100x the largest makes one
    per-tensor scale so coarse that most weights round to 0; per channel, every other row is untouched."""
    rng = random.Random(seed)
    name, layer = rng.choice(LINEAR_NAMES), rng.randrange(model.config.n_layer)
    w = model.transformer.h[layer].get_submodule(name).weight.detach().clone()
    row, col = rng.randrange(w.shape[0]), rng.randrange(w.shape[1])
    spiked = w.clone()
    spiked[row, col] = 100 * w.abs().max()
    others = torch.ones(w.shape[0], dtype=torch.bool)
    others[row] = False
    where = f"h.{layer}.{name}.weight {tuple(w.shape)} with w[{row}, {col}] set to 100x its largest |weight|"
    q_tensor, scale_tensor = student.quantize_per_tensor(spiked)
    zeros = (q_tensor[others] == 0).float().mean().item()
    error_tensor = relative_error(student.dequantize(q_tensor, scale_tensor)[others], w[others])
    assert zeros > 0.5 and error_tensor > 0.3, (f"{where}: per tensor, {zeros:.0%} of the other weights should round to 0 (expected > 50%) "
                                                f"and their relative error be large (got {error_tensor:.3f}); is the scale max|w| / 127 over the WHOLE tensor?")
    q_spiked, scale_spiked = student.quantize_per_channel(spiked)
    q_clean, scale_clean = student.quantize_per_channel(w)
    assert torch.equal(q_spiked[others], q_clean[others]) and torch.equal(scale_spiked[others], scale_clean[others]), (
        f"{where}: per channel, only row {row} may change; the other rows' integers and scales must be exactly those without the "
        f"outlier (a scale per INPUT column would spread it down column {col}; see {HINTS}, quantize_per_channel, hint 1).")
    error_channel = relative_error(student.dequantize(q_spiked, scale_spiked)[others], w[others])
    assert error_channel < 0.02, f"{where}: per channel the other rows' relative error is {error_channel:.3f}, expected < 0.02."


def skewed_inputs(seed):
    """Seeded activation-like tensors: after a GELU (a little below 0, long tail above), all positive,
    all negative, and centred."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 96, generator=g) * 2
    return {"gelu": F.gelu(x), "positive": torch.rand(500, generator=g) * 3 + 1, "negative": -torch.rand(4, 50, generator=g) * 5 - 0.5,
            "centred": x[:2]}


def test_8b_asymmetric_zero_point(student, seed):
    """Q = round(r / s) + Z over 0..255, the range [min(x, 0), max(x, 0)]: torch.ao's quint8 observer's
    scale and zero point, torch.quantize_per_tensor's integers, 0 stored exactly, half-step error; on
    skewed values clearly more precise than symmetric int8."""
    from torch.ao.quantization.observer import MinMaxObserver

    hint = f"see {HINTS}, quantize_asymmetric"
    for name, x in skewed_inputs(seed).items():
        got = student.quantize_asymmetric(x)
        assert isinstance(got, tuple) and len(got) == 3, f"quantize_asymmetric should return (q, scale, zero_point), got {type(got).__name__}."
        q, scale, zero_point = got
        assert isinstance(q, torch.Tensor) and q.dtype == torch.uint8 and q.shape == x.shape, (
            f"{name} values: q should be a uint8 tensor of x's shape {tuple(x.shape)}, got {getattr(q, 'dtype', type(q).__name__)} ({hint}).")
        assert isinstance(zero_point, int) and 0 <= zero_point <= 255, f"{name} values: zero_point should be a Python int in 0..255, got {zero_point!r}."
        observer = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        observer(x)
        ao_scale, ao_zero = observer.calculate_qparams()
        assert abs(float(scale) / ao_scale.item() - 1) < 1e-5 and zero_point == int(ao_zero), (
            f"{name} values (min {x.min().item():.3g}, max {x.max().item():.3g}): got scale {float(scale):.6g} and zero point {zero_point}, "
            f"torch.ao's quint8 observer gives {ao_scale.item():.6g} and {int(ao_zero)}: the range must include 0 ({hint}, hint 2).")
        ao_q = torch.quantize_per_tensor(x, ao_scale.item(), int(ao_zero), torch.quint8).int_repr()
        off = (q.int() - ao_q.int()).abs()
        exact = x.double() / float(scale)
        tie = (exact - exact.floor() - 0.5).abs() < 1e-4
        assert not ((off > 1) | ((off == 1) & ~tie)).any(), (
            f"{name} values: {int((off > 0).sum())} integers differ from torch.quantize_per_tensor's, first at "
            f"x = {x.flatten()[(off.flatten() > 0).nonzero()[0]].item():.5g} ({hint}, hint 3).")
        back = student.dequantize_asymmetric(q, scale, zero_point)
        assert isinstance(back, torch.Tensor) and back.dtype == torch.float32, "dequantize_asymmetric should give float32."
        err = (back - x).abs().max().item()
        assert err <= float(scale) / 2 * (1 + 1e-4), f"{name} values: the round trip is off by {err / float(scale):.2f} steps (at most 0.5; {hint})."
        zero_back = student.dequantize_asymmetric(torch.tensor([zero_point], dtype=torch.uint8), scale, zero_point)
        assert zero_back.item() == 0, f"{name} values: the zero point should dequantize to exactly 0, got {zero_back.item()!r}."
    x = skewed_inputs(seed)["positive"]  # the lesson: all 256 levels over the values, not 128 of 255 over [-max, max]
    q, scale, zero_point = student.quantize_asymmetric(x)
    asym = (student.dequantize_asymmetric(q, scale, zero_point) - x).abs().mean().item()
    qs, ss = reference.quantize_per_tensor(x[None])
    sym = (reference.dequantize(qs, ss)[0] - x).abs().mean().item()
    assert asym < 0.75 * sym, f"on values in [1, 4], asymmetric should be about twice as precise as symmetric: mean error {asym:.3g} vs {sym:.3g}."


def test_8b_asymmetric_scale_is_a_float32_scalar_tensor(student, seed):
    """quantize_asymmetric's scale is a float32 0-d tensor (and its zero point a Python int) for any input: skewed,
    all zeros, or float64 values."""
    inputs = dict(skewed_inputs(seed), zeros=torch.zeros(3, 4), float64=skewed_inputs(seed)["gelu"].double())
    for name, x in inputs.items():
        q, scale, zero_point = student.quantize_asymmetric(x)
        assert isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.dim() == 0, (
            f"quantize_asymmetric on {name} values ({x.dtype}): the scale should be a float32 0-d tensor, got "
            f"{type(scale).__name__} {getattr(scale, 'dtype', '')} {tuple(getattr(scale, 'shape', ()))} (see {HINTS}, quantize_asymmetric).")
        assert isinstance(zero_point, int) and 0 <= zero_point <= 255, (
            f"quantize_asymmetric on {name} values: the zero point should be a Python int in 0..255, got {zero_point!r}.")


def test_8b_rejects_bad_inputs(student, seed):
    """A weight that is not a 2-D float tensor, or a group size that does not divide, gets a ValueError."""
    w = weights(seed)
    student.quantize_per_channel(w)  # works on a good one first
    for bad in (w.flatten(), w[None], w.to(torch.int32)):
        for fn in (student.quantize_per_tensor, student.quantize_per_channel, lambda t: student.quantize_per_group(t, 1)):
            with pytest.raises(ValueError):
                fn(bad)
    with pytest.raises(ValueError):
        student.quantize_per_group(w, 0)


# ----------------------------------------------------------------------------------------------
# 8c: the int8 Linear and the quantized model

def float_tensors(module, at_least):
    return [(name, tuple(t.shape)) for name, t in [*module.named_parameters(), *module.named_buffers()]
            if t.is_floating_point() and t.numel() >= at_least]


def test_8c_int8_linear_stores_int8(student, model, seed):
    """Int8Linear keeps int8 weights and float scales, no float copy of the matrix: measured from its
    tensors, at least 3.5x fewer bytes than the Linear's; the Linear itself is left as it was."""
    rng = random.Random(seed)
    block = model.transformer.h[rng.randrange(model.config.n_layer)]
    layers = [block.get_submodule(name) for name in LINEAR_NAMES]
    layers += [nn.Linear(rng.randint(64, 256), rng.randint(64, 256), bias=False), nn.Linear(200, 96)]
    for linear in layers:
        before = {k: v.clone() for k, v in linear.state_dict().items()}
        int8 = student.Int8Linear(linear)
        what = f"Int8Linear(nn.Linear({linear.in_features}, {linear.out_features}, bias={linear.bias is not None}))"
        assert isinstance(int8, nn.Module), f"{what} should be an nn.Module (it replaces a layer inside the model)."
        big = float_tensors(int8, linear.weight.numel() // 2)
        assert not big, f"{what} holds float tensors as big as the weight: {big}; store the int8 matrix and its scales only (see {HINTS}, Int8Linear.__init__, hint 1)."
        int8_tensors = [t for t in [*int8.parameters(), *int8.buffers()] if t.dtype == torch.int8]
        assert sum(t.numel() for t in int8_tensors) == linear.weight.numel(), f"{what} should hold the {linear.weight.numel()} weights as int8."
        ratio = tensor_bytes(linear) / tensor_bytes(int8)
        assert ratio >= BYTES_BOUND, f"{what}: {tensor_bytes(int8)} bytes against the Linear's {tensor_bytes(linear)}: {ratio:.2f}x, expected >= {BYTES_BOUND}x."
        assert all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in linear.state_dict().items()), (
            f"{what} changed the nn.Linear it was given: quantize a copy of its weight, leave the layer as it was.")
    with pytest.raises(ValueError):
        student.Int8Linear(layers[-2], granularity="row")


def reachable_float_tensors(obj, at_least):
    """The float tensors of at least `at_least` elements reachable from obj's attributes (its buffers, parameters,
    submodules, plain attributes, and the lists and dicts among them)."""
    found, seen, todo = [], set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, type, types.ModuleType, types.FunctionType,
                                                 types.MethodType, types.BuiltinFunctionType)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and item.numel() >= at_least:
                found.append(tuple(item.shape))
        elif isinstance(item, dict):
            todo += list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo += list(item)
        elif hasattr(item, "__dict__"):
            todo += list(vars(item).values())
    return found


def test_8c_int8_linear_keeps_buffers(student, seed):
    """weight_int8, scale and bias are buffers: they are in the state dict (and follow .to()), and nothing trains them
    (no parameters); bias is the Linear's, as a float tensor, or None."""
    g = torch.Generator().manual_seed(seed)
    for bias in (True, False):
        linear = nn.Linear(48, 24, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(24, 48, generator=g))
        int8 = student.Int8Linear(linear)
        what = f"Int8Linear(nn.Linear(48, 24, bias={bias}))"
        expected = {"weight_int8", "scale"} | ({"bias"} if bias else set())
        buffers = dict(int8.named_buffers())
        missing = sorted(expected - set(buffers))
        assert not missing, (f"{what} keeps no buffer named {missing} (its buffers: {sorted(buffers)}): register them with "
                             f"self.register_buffer, so that they follow .to() and the state dict (see {HINTS}, Int8Linear.__init__, hint 1).")
        parameters = [name for name, _ in int8.named_parameters()]
        assert not parameters, f"{what} has parameters {parameters}: nothing in it is trained; keep them as buffers."
        if bias:
            assert buffers["bias"].is_floating_point() and torch.equal(buffers["bias"], linear.bias.detach()), (
                f"{what}: the bias buffer should hold the Linear's bias, in float.")
        else:
            assert getattr(int8, "bias", None) is None, f"{what}: a Linear without a bias gives bias = None."


def test_8c_int8_linear_follows_the_inputs_dtype(student, seed):
    """The dequantized weight (and the bias) take x's dtype: a float64 input gives the float64 matmul of the same
    integers and scales, a bfloat16 input a bfloat16 output."""
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(64, 40)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 64, generator=g))
    int8 = student.Int8Linear(linear)
    weight = stored_integers(int8, linear.weight, "channel", "Int8Linear(nn.Linear(64, 40))")
    x = torch.randn(3, 5, 64, generator=g)
    for dtype, bound in [(torch.float64, 1e-6), (torch.bfloat16, 0.05)]:
        got = int8(x.to(dtype))
        expected = F.linear(x.double(), weight.double(), linear.bias.detach().double())
        assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == expected.shape, (
            f"Int8Linear on a {dtype} input [3, 5, 64] should give {dtype} [3, 5, 40], got {getattr(got, 'dtype', type(got).__name__)} "
            f"{tuple(getattr(got, 'shape', ()))}: dequantize the weight in x's dtype (see {HINTS}, Int8Linear.forward, hint 2).")
        error = ((got.double() - expected).norm() / expected.norm()).item()
        assert error < bound, f"Int8Linear on a {dtype} input differs from the matmul with its dequantized weight by {error:.2e} (relative)."


def test_8c_int8_linear_dequantizes_on_every_call(student, seed):
    """Between calls only the int8 matrix is kept: after forward passes, no float tensor as big as the weight is
    reachable from the layer (a dequantized weight cached on it would be), and new integers written into weight_int8
    are what the next call computes with."""
    g = torch.Generator().manual_seed(seed)
    for granularity in ("channel", 16):
        linear = nn.Linear(96, 80)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(80, 96, generator=g))
        int8 = student.Int8Linear(linear, granularity)
        what = f"Int8Linear(nn.Linear(96, 80), granularity={granularity!r})"
        x = torch.randn(4, 96, generator=g)
        with torch.no_grad():
            int8(x), int8(x)
        kept = reachable_float_tensors(int8, linear.weight.numel() // 2)
        assert not kept, (f"{what} holds float tensors of shapes {kept} after two forward passes: a float copy of the weight "
                          f"kept between calls is the memory int8 was to save. Dequantize inside forward, into a local "
                          f"(see {HINTS}, Int8Linear.forward, hint 1).")
        new = torch.randint(-127, 128, tuple(int8.weight_int8.shape), generator=g, dtype=torch.int8)
        with torch.no_grad():
            int8.weight_int8.copy_(new)
            got = int8(x)
        expected = F.linear(x, reference.dequantize(new, int8.scale.float()), linear.bias.detach())
        error = relative_error(got, expected)
        assert error < 1e-5, (f"{what}: after new integers were written into weight_int8, forward computed with others (off by "
                              f"{error:.2e}, relative): it should dequantize weight_int8 on every call, not reuse an earlier "
                              f"result (see {HINTS}, Int8Linear.forward, hint 1).")


def test_8c_embedding_reads_one_scale_for_all(student, model, seed):
    """Int8Embedding over an lm_head quantized per tensor: scale [1, 1] is one scale for every row."""
    lm_head = student.Int8Linear(model.lm_head, "tensor")
    q, scale = getattr(lm_head, "weight_int8", None), getattr(lm_head, "scale", None)
    assert isinstance(q, torch.Tensor) and isinstance(scale, torch.Tensor) and tuple(scale.shape) == (1, 1), (
        f"Int8Linear(lm_head, granularity='tensor') should keep weight_int8 and a scale [1, 1], got "
        f"{tuple(getattr(scale, 'shape', ())) or type(scale).__name__} (see {HINTS}, Int8Linear.__init__).")
    table = reference.dequantize(q, scale.float())
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(seed))
    got = student.Int8Embedding(lm_head)(ids)
    assert isinstance(got, torch.Tensor) and got.shape == (2, 5, model.config.n_embd) and got.dtype == torch.float32, (
        f"Int8Embedding(ids [2, 5]) should be float32 [2, 5, {model.config.n_embd}], got {getattr(got, 'dtype', '?')} "
        f"{tuple(getattr(got, 'shape', ()))}.")
    assert torch.allclose(got, table[ids], rtol=1e-6, atol=1e-8), (
        f"Int8Embedding over a per-tensor lm_head: the rows differ from the dequantized matrix's by "
        f"{(got - table[ids]).abs().max().item():.2e}: scale [1, 1] is one scale for all the rows (see {HINTS}, Int8Embedding.forward, hint 2).")


def test_8c_embedding_dequantizes_only_the_rows_asked_for(student, model, seed):
    """A lookup of a few ids dequantizes those rows only: no torch operation inside it makes the whole dequantized
    [vocab, n_embd] matrix (50,257 rows for a handful)."""
    granularity = random.Random(seed).choice(["channel", 16, 32])
    lm_head = student.Int8Linear(model.lm_head, granularity)
    table = reference.dequantize(lm_head.weight_int8, lm_head.scale.float())  # its values graded by the checks above
    ids = torch.randint(0, model.config.vocab_size, (2, 3), generator=torch.Generator().manual_seed(seed))
    embedding = student.Int8Embedding(lm_head)
    with _RecordTensors() as record:
        got = embedding(ids)
    whole = [name for name, _, results in record.ops for t in results
             if t.is_floating_point() and t.numel() == table.numel() and torch.allclose(t.reshape(table.shape).float(), table)]
    assert not whole, (
        f"Int8Embedding (granularity={granularity!r}) dequantized the whole [{table.shape[0]}, {table.shape[1]}] matrix "
        f"({', '.join(sorted(set(whole)))}) to read {ids.numel()} rows: look up the int8 rows of the ids and their scales "
        f"first, then dequantize only those (see {HINTS}, Int8Embedding.forward, hint 1).")
    assert torch.allclose(got, table[ids], rtol=1e-6, atol=1e-8), "Int8Embedding's rows differ from the dequantized matrix's."
    generator = torch.Generator().manual_seed(seed)
    for vocab in (1, 2, 3):  # the smallest tables: a scale per row, as short as the one scale of a per-tensor weight
        small = torch.nn.Linear(16, vocab, bias=False)
        with torch.no_grad():
            small.weight.copy_(torch.randn(vocab, 16, generator=generator) * torch.arange(1.0, vocab + 1)[:, None])
        lm = student.Int8Linear(small.to(model.device), "channel")
        few = torch.tensor([[i % vocab for i in range(4)]], device=model.device)
        expected = reference.dequantize(lm.weight_int8, lm.scale.float())[few]
        assert torch.allclose(student.Int8Embedding(lm)(few), expected, rtol=1e-6, atol=1e-8), (
            f"Int8Embedding over a {vocab}-row lm_head quantized per channel: each row has its own scale, however few the rows "
            f"(see {HINTS}, Int8Embedding.forward, hint 2).")


def granularity_name(granularity):
    return {"tensor": "per tensor", "channel": "per channel"}.get(granularity, f"per group of {granularity}")


def scale_shape(granularity, shape):
    """The scale's shape that a granularity gives a weight [out, in]."""
    out, cols = shape
    return (1, 1) if granularity == "tensor" else (out, 1) if granularity == "channel" else (out, cols // granularity)


def guess_granularity(shape, weight_shape):
    """Which granularity a scale of this shape belongs to, in words (for the failure message)."""
    out, cols = weight_shape
    if tuple(shape) == (1, 1):
        return "per tensor"
    if tuple(shape) == (out, 1):
        return "per channel"
    if len(shape) == 2 and shape[0] == out and shape[1] and cols % shape[1] == 0:
        return f"per group of {cols // shape[1]}"
    return "no granularity of a [out, in] weight"


def stored_integers(layer, weight, granularity, what, hint="Int8Linear.__init__"):
    """The int8 matrix and scales an Int8Linear keeps (its weight_int8 and scale buffers), checked against
    the float weight it came from: the scales that `granularity` gives, and round(w / scale) up to exact
    ties. A float twin of the layer built from them is what the layer must compute."""
    q, scale = getattr(layer, "weight_int8", None), getattr(layer, "scale", None)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and q.shape == weight.shape and isinstance(scale, torch.Tensor), (
        f"{what} should keep its weight as an int8 buffer weight_int8 {tuple(weight.shape)} and its scales as a buffer scale "
        f"(see the Int8Linear docstring), got {getattr(q, 'dtype', type(q).__name__)} and {type(scale).__name__}.")
    expected = reference.quantize(weight.detach(), granularity)[1]
    if tuple(scale.shape) != tuple(expected.shape):
        raise AssertionError(
            f"{what}: asked for {granularity_name(granularity)} ({tuple(expected.shape)} scales for a {tuple(weight.shape)} "
            f"weight), it holds {tuple(scale.shape)} scales: those of {guess_granularity(scale.shape, weight.shape)}. Is the "
            f"granularity passed on to every layer it quantizes (not left to a default)? (see {HINTS}, {hint}, hint 2).")
    close = torch.isclose(scale.float(), expected, rtol=1e-5, atol=0)
    if not close.all():
        i = tuple((~close).nonzero()[0].tolist())
        raise AssertionError(f"{what}: scale{list(i)} is {scale[i].item():.6g}, expected max|w| / 127 = {expected[i].item():.6g} over "
                             f"its weights ({granularity_name(granularity)}; see {HINTS}, {hint}, hint 2).")
    check_rounding(q, weight.detach(), expand(scale.float(), q.shape), what, f"see {HINTS}, {hint}")
    return reference.dequantize(q, scale.float())


@pytest.mark.parametrize("granularity", ["channel", "tensor", 32])
def test_8c_int8_linear_output(student, model, tokenizer, seed, granularity):
    """On the activations each Linear of the tiny model really gets: the output equals the matmul with
    the dequantized weights, and per channel its error is no larger than torch.ao's dynamic int8 Linear's
    (which quantizes the activations too)."""
    ids = heldout_ids(tokenizer)
    start = random.Random(seed).randrange(len(ids) - 64)
    inputs = linear_inputs(model, ids[start:start + 64])
    for (layer, name), (linear, x) in inputs.items():
        what = f"Int8Linear(h.{layer}.{name}, granularity={granularity!r})"
        int8 = student.Int8Linear(linear, granularity)
        got = int8(x)
        expected = F.linear(x, stored_integers(int8, linear.weight, granularity, what), linear.bias)
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (
            f"{what} returned {tuple(getattr(got, 'shape', ()))}, expected {tuple(expected.shape)}.")
        diff = relative_error(got, expected)
        assert diff < 1e-5, (f"{what}: the output differs from x @ dequantized(W).T + bias by {diff:.2e} (relative): "
                             f"{'the scale is missing' if diff > 0.5 else 'is the bias there, and each row multiplied by its own scale?'} "
                             f"(see {HINTS}, Int8Linear.forward, hint 2).")
        if granularity == "channel":
            ours = relative_error(got, linear(x))
            ao = relative_error(torch_dynamic_int8(linear)(x.cpu()), linear(x).cpu())  # torch.ao's int8 kernels run on the CPU only
            assert ours <= ao, f"{what}: output error {ours:.2e}, more than torch.ao's dynamic int8 Linear's {ao:.2e}."


def test_8c_tied_embedding_reads_the_int8_matrix(student, model, seed):
    """Int8Embedding over the quantized lm_head: the rows of ids, dequantized, from the one int8 matrix."""
    g = torch.Generator().manual_seed(seed)
    for granularity in ("channel", 16):
        lm_head = student.Int8Linear(model.lm_head, granularity)
        table = stored_integers(lm_head, model.lm_head.weight, granularity, f"Int8Linear(lm_head, granularity={granularity!r})")
        embedding = student.Int8Embedding(lm_head)
        ids = torch.randint(0, model.config.vocab_size, (3, 7), generator=g)
        got = embedding(ids)
        assert isinstance(got, torch.Tensor) and got.shape == (3, 7, model.config.n_embd) and got.dtype == torch.float32, (
            f"Int8Embedding(ids [3, 7]) should be float32 [3, 7, {model.config.n_embd}], got {getattr(got, 'dtype', '?')} {tuple(getattr(got, 'shape', ()))}.")
        assert torch.allclose(got, table[ids], rtol=1e-6, atol=1e-8), (
            f"Int8Embedding (granularity={granularity!r}) rows differ from the dequantized int8 matrix's rows by "
            f"{(got - table[ids]).abs().max().item():.2e}: look up each id's int8 row and ITS scales (see {HINTS}, Int8Embedding.forward, hint 2).")


def dequantized_twin(model, quantized, include_embedding, what, granularity="channel"):
    """A float copy of `model` whose quantized weights are the dequantized integers `quantized` keeps
    (checked against the fp32 weights at `granularity`): the student's quantized model must compute what
    it computes."""
    twin = copy.deepcopy(model)
    layers = [(f"h.{i}.{name}", block.get_submodule(name), twin_block.get_submodule(name))
              for i, (block, twin_block) in enumerate(zip(quantized.transformer.h, twin.transformer.h)) for name in LINEAR_NAMES]
    if include_embedding:
        layers.append(("lm_head", quantized.lm_head, twin.lm_head))  # tied: wte reads the same matrix
    with torch.no_grad():
        for name, layer, float_layer in layers:
            float_layer.weight.copy_(stored_integers(layer, float_layer.weight, granularity, f"{what}: {name}", "quantize_model"))
    return on_device(twin)


SLACK = 1.02  # bytes: what the int8 matrices and their float32 scales need, and 2% to spare


def int8_bytes(weight, granularity):
    """Bytes of a weight as int8 plus its float32 scales at a granularity."""
    return weight.numel() + 4 * math.prod(scale_shape(granularity, tuple(weight.shape)))


def group_size(seed):
    """A seeded group size that divides every Linear's input width in the tiny model (128 and 512)."""
    return random.Random(seed + 3).choice([8, 16, 32, 64])


@pytest.mark.parametrize(("granularity", "include_embedding"),
                         [("channel", False), ("channel", True), ("tensor", False), ("group", False), ("group", True)])
def test_8c_quantize_model_replaces_every_linear(student, model, seed, granularity, include_embedding):
    """A quantized COPY at every granularity: every Linear of every block an Int8Linear holding exactly the
    integers and scales of ITS weight quantized at that granularity (and the tied matrix once, as an option),
    the given model untouched, bytes measured, and logits those of its int8 weights. (Per tensor with the
    embedding is refused: the stub gives that check.)"""
    granularity = group_size(seed) if granularity == "group" else granularity
    what = f"quantize_model(model, granularity={granularity!r}, include_embedding={include_embedding})"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = student.quantize_model(model, granularity, include_embedding=include_embedding)
    assert quantized is not model and all(torch.equal(before[k], v) for k, v in model.state_dict().items()), (
        f"{what} changed the model it was given: quantize a copy (copy.deepcopy) and return it (see {HINTS}, quantize_model, hint 1).")
    assert all(isinstance(m, nn.Linear) for b in model.transformer.h for m in (b.attn.c_attn, b.mlp.c_fc)), f"{what} replaced the given model's layers."
    left = [f"h.{i}.{name}" for i, b in enumerate(quantized.transformer.h) for name in LINEAR_NAMES if isinstance(b.get_submodule(name), nn.Linear)]
    assert not left, f"{what} left these as float nn.Linear: {left}."
    twin = dequantized_twin(model, quantized, include_embedding, what, granularity)  # every layer at this granularity
    layers = [b.get_submodule(n) for b in model.transformer.h for n in LINEAR_NAMES]
    blocks_fp32, blocks_int8 = tensor_bytes(model.transformer.h), tensor_bytes(quantized.transformer.h)
    linears = sum(tensor_bytes(linear) for linear in layers)
    needed = sum(int8_bytes(linear.weight, granularity) + tensor_bytes(linear) - 4 * linear.weight.numel() for linear in layers)
    assert blocks_int8 <= blocks_fp32 - linears + SLACK * needed, (
        f"{what}: the blocks hold {blocks_int8:,} bytes against {blocks_fp32:,} in fp32; their Linears, {linears:,} bytes in fp32, "
        f"need {needed:,} as int8 with {granularity_name(granularity)} float32 scales and float biases: does a float copy of "
        f"a weight stay behind? (see {HINTS}, Int8Linear.__init__, hint 1).")
    if include_embedding:
        table = model.lm_head.weight
        needed = tensor_bytes(model) - 4 * table.numel() + int8_bytes(table, granularity) - (linears - needed)
        assert tensor_bytes(quantized) <= SLACK * needed, (
            f"{what}: {tensor_bytes(quantized):,} bytes against {tensor_bytes(model):,} in fp32, where {needed:,} would do: the "
            f"tied wte / lm_head matrix must be stored ONCE, as int8 (see {HINTS}, quantize_model, hint 2).")
    else:
        assert isinstance(quantized.lm_head, nn.Linear) and quantized.lm_head.weight is quantized.transformer.wte.weight, (
            f"{what}: lm_head and wte should stay the tied float matrix unless include_embedding=True.")
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(seed)).to(model.device)
    positions = torch.arange(24, device=model.device)[None].expand(2, -1)
    with torch.no_grad():
        diff = (quantized(ids, positions) - twin(ids, positions)).abs().max().item()
    assert diff < 1e-4, (f"{what}: logits differ by {diff:.2e} from those of the same model with its int8 weights dequantized "
                         f"(expected < 1e-4): is every quantized layer (the embedding too) used in the forward? "
                         f"(see {HINTS}, Int8Linear.forward and Int8Embedding.forward)")


@pytest.fixture(scope="module")
def heldout_windows(tokenizer, seed):
    """Four seeded windows of 128 tokens of the held-out text (never trained on)."""
    ids = heldout_ids(tokenizer)
    rng = random.Random(seed)
    return ids, sorted(rng.sample(range(0, len(ids) - 129, 128), 4))


@pytest.mark.parametrize("include_embedding", [False, True])
def test_8c_perplexity_stays_within_one_percent(student, model, heldout_windows, include_embedding):
    ids, starts = heldout_windows
    quantized = student.quantize_model(model, include_embedding=include_embedding)
    fp32, int8 = perplexity(model, ids, 128, starts=starts), perplexity(quantized, ids, 128, starts=starts)
    assert int8 <= PERPLEXITY_BOUND * fp32, (
        f"on 4 windows of held-out text, perplexity {int8:.2f} int8 against {fp32:.2f} fp32 (+{int8 / fp32 - 1:.1%}); the bound is "
        f"+{PERPLEXITY_BOUND - 1:.0%} (include_embedding={include_embedding}).")


@pytest.mark.parametrize("include_embedding", [False, True])
def test_8c_greedy_agreement_under_the_kv_cache(student, model, seed, include_embedding):
    """The int8 model runs under exercise 2's KV-cache generate (the reference's), and the fp32 model
    would pick the int8 model's greedy token at least 90% of the time."""
    prompts = sample_prompts(model, 4, 4, 40, seed + 8)
    quantized = student.quantize_model(model, include_embedding=include_embedding)
    result = greedy_agreement(model, quantized, prompts, 16, ex2.generate)
    assert result.agreement >= AGREEMENT_BOUND, (
        f"the fp32 model picks the int8 model's greedy token {result.agreement:.0%} of the time over {result.tokens} tokens "
        f"({result.identical} of {result.prompts} continuations identical); the bound is {AGREEMENT_BOUND:.0%} "
        f"(include_embedding={include_embedding}).")


@pytest.mark.timing
def test_8c_speed_against_reference(student, model, device, seed):
    """quantize_model and a forward of the quantized model, against the reference's (median paired ratios)."""
    quantized, expected = student.quantize_model(model), reference.quantize_model(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(seed)).to(model.device)
    positions = torch.arange(128, device=model.device)[None]
    twin = dequantized_twin(model, quantized, False, "quantize_model(model)")
    with torch.no_grad():
        assert (quantized(ids, positions) - twin(ids, positions)).abs().max().item() < 1e-4, "correctness first: see the other checks."
        limit = 3.0 if device == "cpu" else 2.0
        forward = paired_timing(lambda: quantized(ids, positions), lambda: expected(ids, positions), device=device)
        build = paired_timing(lambda: student.quantize_model(model), lambda: reference.quantize_model(model), repeats=3, device=device)
    assert forward.ratio < limit, f"your quantized model's forward takes {forward.ratio:.2f}x the reference's (limit {limit}x):\n{forward.report('yours', 'reference')}"
    assert build.ratio < limit, f"your quantize_model takes {build.ratio:.2f}x the reference's (limit {limit}x):\n{build.report('yours', 'reference')}"
