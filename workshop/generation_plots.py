"""Measurements and plots shared by the notebooks (notebooks/*.ipynb) and the slides
(scripts/make_figures.py writes slides/figures/*.png with these same functions).

Every number drawn here comes from running the workshop's own code: the model of gpt.py, the
generate() of exercises 1 and 2 (whichever implementation the caller picked), the cost counter of
workshop/harness.py. Nothing is typed in by hand.

    from workshop.generation_plots import measure_generation, plot_generation_cost
"""

import statistics
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from workshop.harness import count_model_work, synchronize

NO_EOS = -1  # a token id that never comes: every generate() call yields exactly max_new_tokens
NAIVE_COLOR, CACHED_COLOR, WRONG_COLOR = "tab:red", "tab:blue", "crimson"


# ----------------------------------------------------------------------------------------------
# Measuring

@dataclass
class GenerationCost:
    """What generating costs, per number of new tokens: median seconds and token-passes per label."""
    lengths: list
    seconds: dict  # {label: [median seconds for each length]}
    token_passes: dict  # {label: [token positions through the model for each length]}

    def only(self, *labels):
        """The same measurements restricted to some labels."""
        return GenerationCost(self.lengths, {k: self.seconds[k] for k in labels}, {k: self.token_passes[k] for k in labels})

    def table(self):
        """The numbers as text: one row per length, a speedup column when there are two labels."""
        labels = list(self.seconds)
        head = f"{'new tokens':>10}" + "".join(f" {label + ' (s)':>14}" for label in labels)
        head += "".join(f" {label + ' tokens':>16}" for label in labels)
        head += f" {'speedup':>8}" if len(labels) == 2 else ""
        rows = [head]
        for i, n in enumerate(self.lengths):
            row = f"{n:>10}" + "".join(f" {self.seconds[label][i]:>14.3f}" for label in labels)
            row += "".join(f" {self.token_passes[label][i]:>16,}" for label in labels)
            if len(labels) == 2:
                row += f" {self.seconds[labels[0]][i] / self.seconds[labels[1]][i]:>7.1f}x"
            rows.append(row)
        return "\n".join(rows)


def measure_generation(generators, model, prompt_ids, lengths, repeats=3, warmup=1):
    """Time and count each generate function at each number of new tokens.

    generators: {label: generate(model, prompt_ids, max_new_tokens, eos_token_id)}.
    After `warmup` untimed calls of each, every length is run `repeats` times per function, the
    functions taking turns to go first so that a change in machine load hits them all alike. Each run
    is under the cost counter (harness.count_model_work: a hook per forward pass, negligible next to
    the pass itself). Times are medians; token-passes are the same in every run.
    """
    labels = list(generators)
    for _ in range(warmup):
        for label in labels:
            generators[label](model, prompt_ids, min(lengths), NO_EOS)
    cost = GenerationCost(list(lengths), {label: [] for label in labels}, {label: [] for label in labels})
    for n in lengths:
        samples, tokens = {label: [] for label in labels}, {}
        for r in range(repeats):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                with count_model_work(model) as work:
                    synchronize(model.device)
                    start = time.perf_counter()
                    generators[label](model, prompt_ids, n, NO_EOS)
                    synchronize(model.device)
                    samples[label].append(time.perf_counter() - start)
                tokens[label] = work.tokens
        for label in labels:
            cost.seconds[label].append(statistics.median(samples[label]))
            cost.token_passes[label].append(tokens[label])
    return cost


def positions_per_pass(model, generate, prompt_ids, max_new_tokens):
    """The positions that each forward pass of one generate() call computes, in order: a list with
    one list of position ids per forward pass. Every path into a gpt.py model, with or without a
    KV cache, looks up the position embeddings transformer.wpe, so a hook there sees them all."""
    passes = []
    hook = model.transformer.wpe.register_forward_hook(lambda module, args, out: passes.append(args[0][0].tolist()))
    try:
        generate(model, prompt_ids, max_new_tokens, NO_EOS)
    finally:
        hook.remove()
    return passes


def attention_pattern(q_len, kv_len, attn_mask=None, is_causal=False):
    """Which keys each query attends to inside F.scaled_dot_product_attention, found by asking SDPA
    itself: with all-zero queries every allowed key gets the same score, and with the identity as
    values the output row i is query i's attention weights. Returns a bool [q_len, kv_len] tensor."""
    q = torch.zeros(1, 1, q_len, kv_len)
    k = torch.zeros(1, 1, kv_len, kv_len)
    v = torch.eye(kv_len)[None, None]
    weights = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return weights[0, 0] > 0


def next_token_distribution(model, input_ids, k=10):
    """Top-k (token ids, probabilities) of the model's next-token distribution after input_ids [1, T]."""
    with torch.no_grad():
        logits = model(input_ids, torch.arange(input_ids.shape[1], device=input_ids.device)[None])
    top = logits[0, -1].float().softmax(-1).topk(k)
    return top.indices.tolist(), top.values.tolist()


# ----------------------------------------------------------------------------------------------
# Plotting: each function returns the matplotlib Figure (a notebook shows it, make_figures saves it)

def plot_next_token(token_ids, probs, tokenizer, prompt_text=""):
    """Horizontal bars of the most likely next tokens; the greedy choice (argmax) highlighted."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    labels = [repr(tokenizer.decode([t])) for t in token_ids]
    colors = [CACHED_COLOR if i == 0 else "lightgray" for i in range(len(token_ids))]
    ax.barh(range(len(token_ids)), probs, color=colors)
    ax.set_yticks(range(len(token_ids)), labels, fontfamily="monospace")
    ax.invert_yaxis()
    ax.set_xlabel("probability of the next token (softmax of the last logits)")
    title = "blue: the argmax, greedy decoding's choice"
    ax.set_title(f"next token after {prompt_text!r}\n({title})" if prompt_text else title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_positions_per_pass(passes_by_label, prompt_len):
    """One grid per generate function: row = forward pass, column = position; a filled cell is a
    position the pass computed. Naive fills a triangle (quadratic), the KV cache a diagonal (linear)."""
    labels = list(passes_by_label)
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        passes = passes_by_label[label]
        width = max(max(p) for p in passes) + 1
        grid = torch.zeros(len(passes), width)
        for row, positions in enumerate(passes):
            for pos in positions:
                grid[row, pos] = 1 if pos < prompt_len else 2
        ax.imshow(grid, cmap=_three_colors(), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        total = sum(len(p) for p in passes)
        ax.set_title(f"{label}: {total} token-passes", fontsize=10)
        ax.set_xlabel("position (dark: prompt, light: generated)")
        ax.set_ylabel("forward pass")
        ax.set_yticks(range(len(passes)), [str(i) for i in range(len(passes))], fontsize=7)
    fig.tight_layout()
    return fig


def plot_generation_cost(cost, prompt_len=None, title=None):
    """Two panels against the number of new tokens: measured time, and token-passes (the counter),
    with the cost model's curves when prompt_len is given. Labels containing "naive" are drawn red."""
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, seconds in cost.seconds.items():
        ax_t.plot(cost.lengths, seconds, "o-", color=_color(label), label=label)
    if len(cost.seconds) == 2:  # the speedup at the longest length
        slow, fast = (cost.seconds[label][-1] for label in cost.seconds)
        ax_t.annotate(f"{slow / fast:.1f}x", (cost.lengths[-1], fast), textcoords="offset points", xytext=(-4, 8),
                      ha="right", fontsize=10, fontweight="bold", color=_color(list(cost.seconds)[1]))
    ax_t.set(xlabel="new tokens", ylabel="seconds (median)", title="wall clock")
    for label, passes in cost.token_passes.items():
        ax_c.plot(cost.lengths, passes, "o-", color=_color(label), label=label)
        ax_c.annotate(f"{passes[-1]:,}", (cost.lengths[-1], passes[-1]), textcoords="offset points", xytext=(-4, 6),
                      ha="right", fontsize=9, color=_color(label))
    if prompt_len is not None:
        fine = range(1, max(cost.lengths) + 1)
        ax_c.plot(fine, [naive_token_passes(prompt_len, n) for n in fine], ":", color="gray",
                  label=f"n*P + n(n-1)/2 (P = {prompt_len})")
        if len(cost.token_passes) > 1:
            ax_c.plot(fine, [cached_token_passes(prompt_len, n) for n in fine], "--", color="gray", label="P + n - 1")
    ax_c.set(xlabel="new tokens", ylabel="token positions through the model", title="work (cost counter)")
    for ax in (ax_t, ax_c):
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels above the last points
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_causal_masks(causal_mask, cases=((6, 6), (3, 7), (1, 7))):
    """Top row: what SDPA's is_causal=True lets each query see; bottom row: the lower-right aligned
    causal_mask(q_len, kv_len) of exercise 2 (None = no mask). Cells where is_causal disagrees with
    the correct pattern are crossed out. Queries are the LAST q_len positions of kv_len."""
    fig, axes = plt.subplots(2, len(cases), figsize=(3.3 * len(cases), 4.6), squeeze=False)
    for col, (q_len, kv_len) in enumerate(cases):
        mask = causal_mask(q_len, kv_len, "cpu")
        right = attention_pattern(q_len, kv_len, attn_mask=mask)
        upper_left = attention_pattern(q_len, kv_len, is_causal=True)
        kind = "full prefill" if q_len == kv_len else "decode" if q_len == 1 else "chunked prefill"
        for row, (pattern, name) in enumerate([(upper_left, "is_causal=True"),
                                                (right, f"causal_mask({q_len}, {kv_len})" + (" = None" if mask is None else ""))]):
            ax = axes[row, col]
            ax.imshow(pattern.float(), cmap=_three_colors(), vmin=0, vmax=2, interpolation="nearest")
            wrong = pattern != right
            for i, j in wrong.nonzero().tolist():
                ax.text(j, i, "x", ha="center", va="center", color=WRONG_COLOR, fontsize=14, fontweight="bold")
            verdict = "WRONG" if wrong.any() else "ok"
            ax.set_title(f"{name}\n{kind}: {verdict}", fontsize=9, color=WRONG_COLOR if wrong.any() else "black")
            ax.set_xticks(range(kv_len))
            ax.set_yticks(range(q_len), [str(kv_len - q_len + i) for i in range(q_len)])
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("query position", fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# The cost model

def naive_token_passes(prompt_len, n):
    """Naive greedy: step t runs all prompt_len + t tokens, for t = 0 .. n-1."""
    return n * prompt_len + n * (n - 1) // 2


def cached_token_passes(prompt_len, n):
    """KV cache: one prefill of the prompt, then n - 1 decode steps of one token (the last token
    generated is never fed back)."""
    return prompt_len + n - 1


def _color(label):
    return NAIVE_COLOR if "naive" in label.lower() else CACHED_COLOR


def _three_colors():
    from matplotlib.colors import ListedColormap

    return ListedColormap(["#f2f2f2", "#1f4e99", "#7fb2e5"])  # nothing, prompt / allowed, generated
