"""int8 weight-only quantization (module 8), measured and drawn: shared by notebooks/08_quantization.ipynb
and the slides' figures (scripts/make_figures.py draws slides/figures/08_*.png with these same functions).

Every picture runs exercise 8's code (whichever implementation the caller passes in as `ex8`, e.g.
workshop.grading.harness.implementation("ex8_quantization")) on the tiny model's real weights and activations;
the memory and quality bars come from results/quantization.json (bench/quantization.py).
"""

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import Rectangle

from workshop.figures.generation import FONT, MIN_PT, TITLE_PT, readable

SIGN_COLOR, EXPONENT_COLOR, MANTISSA_COLOR, DROPPED_COLOR = "0.75", "#f2b36b", "#7fb2e5", "#e0e0e0"
GRANULARITY_COLORS = {"tensor": "tab:red", "channel": "tab:blue", "group": "tab:green"}
# (name, exponent bits, mantissa bits): IEEE float32 and float16, and Google's bfloat16
FORMATS = (("float32", 8, 23), ("float16", 5, 10), ("bfloat16", 8, 7))


# ----------------------------------------------------------------------------------------------
# 8a: number formats

def course_table(ex8, values=(0.0001, 1e-08, 100000.00001)):
    """The course's table, computed by exercise 8's stored_value: {x: {format: (value, hex)}}."""
    return {x: {name: ex8.stored_value(x, name) for name, _, _ in FORMATS} for x in values}


def bit_rows(ex8, x=0.0001):
    """x in each format, as rows for plot_bit_layouts: (label, hex, exponent bits, mantissa bits, value),
    bfloat16 both rounded (as torch does) and truncated (the low 16 bits of float32 dropped)."""
    rows = []
    for name, e, m in FORMATS:
        value, bits = ex8.stored_value(x, name)
        rows.append((name, bits, e, m, value))
    truncated = ex8.round_to_bfloat16(torch.tensor([x]), "truncate")
    bits = truncated.view(torch.int16).item() & 0xFFFF
    rows.append(("bfloat16, truncated", f"{bits:04X}", 8, 7, truncated.float().item()))
    return rows


def plot_bit_layouts(rows, x=0.0001, figsize=(11.5, 3.9)):
    """One row of boxes per format: the sign, exponent and mantissa bits of x as stored."""
    fig, ax = plt.subplots(figsize=figsize)
    cell = 1.0
    for r, (label, hexbits, e, m, value) in enumerate(rows):
        width = 1 + e + m
        bits = f"{int(hexbits, 16):0{width}b}"
        for i, bit in enumerate(bits):
            color = SIGN_COLOR if i == 0 else EXPONENT_COLOR if i <= e else MANTISSA_COLOR
            ax.add_patch(Rectangle((i * cell, -r), cell * 0.92, 0.8, facecolor=color, edgecolor="none"))
            ax.text(i * cell + 0.46, -r + 0.4, bit, ha="center", va="center", fontsize=MIN_PT, fontfamily="monospace")
        ax.text(-0.6, -r + 0.4, label, ha="right", va="center", fontsize=FONT)
        ax.text(33.2, -r + 0.4, f"{hexbits}  {value:.8g}", ha="left", va="center", fontsize=FONT, fontfamily="monospace")
    handles = [Rectangle((0, 0), 1, 1, facecolor=c) for c in (SIGN_COLOR, EXPONENT_COLOR, MANTISSA_COLOR)]
    ax.legend(handles, ["sign", "exponent", "mantissa"], loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3,
              fontsize=MIN_PT, frameon=False)
    ax.set_xlim(-9.5, 46)
    ax.set_ylim(-len(rows) + 0.6, 1.0)
    ax.set_title(f"x = {x} as stored", fontsize=TITLE_PT, pad=28)
    ax.axis("off")
    readable(fig)
    fig.tight_layout()
    return fig


def rounding_errors(ex8, x):
    """Relative errors (bf16 - x) / x of exercise 8's round_to_bfloat16, {"nearest": ..., "truncate": ...}."""
    return {mode: (ex8.round_to_bfloat16(x, mode).float() - x) / x for mode in ("nearest", "truncate")}


def plot_rounding_errors(errors, what, figsize=(11.5, 3.9)):
    """Histograms of the relative error of float32 -> bfloat16, rounded against truncated."""
    fig, ax = plt.subplots(figsize=figsize)
    step = 2.0 ** -7  # bfloat16's relative spacing near 1.0: 7 mantissa bits
    bins = torch.linspace(-1.1 * step, 1.1 * step, 89).tolist()
    colors = {"nearest": "tab:blue", "truncate": "tab:red"}
    for mode, err in errors.items():
        ax.hist(err.tolist(), bins=bins, color=colors[mode], alpha=0.55,
                label=f"{'round to nearest even' if mode == 'nearest' else 'truncate'}: mean {err.mean().item():+.1e}")
        ax.axvline(err.mean().item(), color=colors[mode], lw=2)
    ax.set_xticks([-step, -step / 2, 0, step / 2, step], ["-2⁻⁷", "-2⁻⁸", "0", "2⁻⁸", "2⁻⁷"])
    ax.set(xlabel="relative error (bfloat16 - x) / x", ylabel="values", title=f"float32 -> bfloat16 on {what}")
    ax.legend(fontsize=MIN_PT, loc="upper right")
    ax.grid(alpha=0.3)
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# 8b: granularity, the outlier, asymmetric

def granularity_errors(ex8, w, group_size=32, rows=None):
    """|dequantize(quantize(w)) - w| per weight for each granularity (only `rows`, if given: a bool
    mask), with the share of weights rounded to 0. {label: {"error": 1-D tensor, "zeros": share}}."""
    quantizers = {"per tensor": ex8.quantize_per_tensor, "per channel": ex8.quantize_per_channel,
                  f"groups of {group_size}": lambda t: ex8.quantize_per_group(t, group_size)}
    out = {}
    for label, quantize in quantizers.items():
        q, scale = quantize(w)
        error = (ex8.dequantize(q, scale) - w).abs()
        keep = rows if rows is not None else torch.ones(w.shape[0], dtype=torch.bool)
        out[label] = {"error": error[keep].flatten(), "zeros": (q[keep] == 0).float().mean().item()}
    return out


def _granularity_color(label):
    return GRANULARITY_COLORS["tensor" if "tensor" in label else "channel" if "channel" in label else "group"]


def _error_histogram(ax, errors, scale_of_weights, title):
    top = max(e["error"].max().item() for e in errors.values()) / scale_of_weights
    bins = torch.linspace(0, top * 1.02, 61).tolist()
    for label, e in errors.items():
        ax.hist((e["error"] / scale_of_weights).tolist(), bins=bins, histtype="step", lw=2, color=_granularity_color(label),
                label=f"{label}: mean {e['error'].mean().item() / scale_of_weights:.3f}, {e['zeros']:.0%} to 0")
    ax.set_yscale("log")
    ax.set(xlabel="|error| / std of the weights", ylabel="weights (log scale)", title=title)
    ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the legend above the bars
    ax.legend(fontsize=MIN_PT, loc="upper right")
    ax.grid(alpha=0.3)


def plot_granularity(errors, w_std, where, figsize=(11.5, 4.2)):
    """Round-trip error histograms of one real weight matrix at three granularities."""
    fig, ax = plt.subplots(figsize=figsize)
    _error_histogram(ax, errors, w_std, f"round-trip error of {where}, int8")
    readable(fig)
    fig.tight_layout()
    return fig


def plot_outlier(errors, w_std, where, outlier, figsize=(11.5, 4.4)):
    """Left: error histograms of the OTHER rows of a matrix with one outlier. Right: perplexity of the
    model with that outlier, fp32 and int8 per tensor and per channel (outlier: results' "outlier")."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.55, 1]})
    _error_histogram(ax1, errors, w_std, f"{where}, one weight x{outlier['factor']:.0f}:\nerror of the other rows")
    labels = ["fp32", "int8\nper tensor", "int8\nper channel"]
    values = [outlier["perplexity"][k] for k in ("fp32", "tensor", "channel")]
    colors = ["0.5", GRANULARITY_COLORS["tensor"], GRANULARITY_COLORS["channel"]]
    ax2.bar(range(3), values, color=colors)
    for i, v in enumerate(values):
        ax2.text(i, v * 1.02, f"{v:.1f}", ha="center", va="bottom", fontsize=MIN_PT)
    ax2.set_xticks(range(3), labels)
    ax2.set_ylim(0, max(values) * 1.18)
    ax2.set(ylabel="perplexity, held-out text", title="the model with that outlier")
    ax2.grid(alpha=0.3, axis="y")
    readable(fig)
    fig.tight_layout()
    return fig


@torch.no_grad()
def gelu_activations(model, ids, layer=0):
    """The values after block `layer`'s MLP GELU (c_fc, then GELU) for the token ids: skewed, as
    activations are (a little below 0, a long tail above)."""
    captured = {}
    fc = model.transformer.h[layer].mlp.c_fc
    hook = fc.register_forward_hook(lambda module, args, out: captured.__setitem__("x", F.gelu(out, approximate="tanh")))
    try:
        x = torch.tensor([ids], device=model.device)
        model(x, torch.arange(len(ids), device=x.device)[None])
    finally:
        hook.remove()
    return captured["x"].flatten().cpu()


def asymmetric_vs_symmetric(ex8, x):
    """Exercise 8 on skewed values x: symmetric per tensor and asymmetric with a zero point. Returns
    {"symmetric": {"error", "levels_used", "range"}, "asymmetric": {...}}."""
    q, scale = ex8.quantize_per_tensor(x[None])
    sym = ex8.dequantize(q, scale)[0]
    qa, sa, za = ex8.quantize_asymmetric(x)
    asym = ex8.dequantize_asymmetric(qa, sa, za)
    return {"symmetric": {"error": (sym - x).abs(), "levels_used": len(q.unique()), "range": (-127 * scale.item(), 127 * scale.item())},
            "asymmetric": {"error": (asym - x).abs(), "levels_used": len(qa.unique()), "range": ((0 - za) * sa.item(), (255 - za) * sa.item()),
                           "zero_point": za}}


def plot_asymmetric(x, result, figsize=(11.5, 4.2)):
    """Left: the values' histogram and the range each scheme's 256 levels cover. Right: their errors."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
    ax1.hist(x.tolist(), bins=120, color="0.55")
    ax1.set_yscale("log")
    colors = {"symmetric": "tab:red", "asymmetric": "tab:blue"}
    top = ax1.get_ylim()[1]
    for i, (name, r) in enumerate(result.items()):
        y = top * (4.0 if i == 0 else 300.0)
        lo, hi = r["range"]
        ax1.plot([lo, hi], [y, y], color=colors[name], lw=5, solid_capstyle="butt")
        ax1.text(result["symmetric"]["range"][0], y * 3, f"{name}: {r['levels_used']} levels used", va="bottom", fontsize=MIN_PT,
                 color=colors[name])
    ax1.axvline(0, color="black", lw=0.8)
    ax1.set_ylim(top=top * 5000)
    ax1.set_xlim(result["symmetric"]["range"][0] * 1.08, result["symmetric"]["range"][1] * 1.08)
    ax1.set(xlabel="value after the GELU", ylabel="values (log scale)", title="activations of h.0's MLP, and the int8 ranges")
    step = max(r["error"].max().item() for r in result.values()) * 1e3
    bins = torch.linspace(0, step * 1.02, 50).tolist()
    for name, r in result.items():
        ax2.hist((r["error"] * 1e3).tolist(), bins=bins, histtype="step", lw=2, color=colors[name],
                 label=f"{name}: mean {r['error'].mean().item() * 1e3:.2f}")
    ax2.set(xlabel="|error| (thousandths)", ylabel="values", title="round-trip error")
    ax2.legend(fontsize=MIN_PT, loc="upper right")
    ax2.set_ylim(top=ax2.get_ylim()[1] * 1.35)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# The whole model: memory and quality (results/quantization.json)

def plot_memory_and_quality(data, figsize=(11.5, 4.2)):
    """From bench/quantization.py's results: the model's bytes, its perplexity change and the greedy
    agreement, per variant."""
    names = list(data["variants"])
    variants = data["variants"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=figsize, gridspec_kw={"width_ratios": [1.3, 1, 1]})
    short = {name: name.replace("int8+embedding", "int8 +\nembedding").replace("int8 per tensor", "int8 per\ntensor")
             .replace("int8 groups of", "int8 groups\nof") for name in names}
    colors = ["0.5" if n == "fp32" else "tab:blue" if "embedding" in n or "groups" in n else "#7fb2e5" for n in names]
    y = range(len(names))
    mib = [variants[n]["bytes"] / 2 ** 20 for n in names]
    ax1.barh(y, mib, color=colors)
    for i, n in enumerate(names):
        ax1.text(mib[i] + max(mib) * 0.02, i, f"{mib[i]:.1f} MiB" + (f", {variants[n]['size_ratio']:.2f}x" if n != "fp32" else ""),
                 va="center", fontsize=MIN_PT)
    ax1.set_yticks(list(y), [short[n] for n in names])
    ax1.set_xlim(0, max(mib) * 1.75)
    ax1.set(xlabel="MiB, every tensor of the model", title="memory")
    rest = names[1:]
    y2 = range(len(rest))
    change = [variants[n]["perplexity_change"] * 100 for n in rest]
    ax2.barh(y2, change, color=colors[1:])
    ax2.axvline(0, color="black", lw=0.8)
    lim = max(abs(c) for c in change) * 2.2 or 0.01
    ax2.set_xlim(-lim, lim)
    for i, c in enumerate(change):
        ax2.text(c + (lim * 0.04 if c >= 0 else -lim * 0.04), i, f"{c:+.3f}", va="center", ha="left" if c >= 0 else "right", fontsize=MIN_PT)
    ax2.set_yticks(list(y2), ["" for _ in rest])
    ax2.set(xlabel="perplexity change vs fp32 (%)", title="held-out perplexity")
    agreement = [variants[n]["agreement"] * 100 for n in rest]
    ax3.barh(y2, agreement, color=colors[1:])
    for i, a in enumerate(agreement):
        ax3.text(a - 1, i, f"{a:.1f}", va="center", ha="right", fontsize=MIN_PT, color="white")
    ax3.set_xlim(min(agreement) - 8, 100)
    ax3.set_yticks(list(y2), ["" for _ in rest])
    ax3.set(xlabel="greedy tokens fp32 agrees with (%)", title="greedy agreement")
    for ax in (ax1, ax2, ax3):
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    ax2.set_ylim(ax1.get_ylim()[0] - 1, ax1.get_ylim()[1] - 1)  # rows aligned with the memory panel's (fp32 has none)
    ax3.set_ylim(ax2.get_ylim())
    readable(fig)
    fig.tight_layout()
    return fig
