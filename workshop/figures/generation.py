"""Measurements and plots shared by the notebooks (notebooks/*.ipynb) and the slides
(scripts/make_figures.py writes slides/figures/*.png with these same functions).

Every number drawn here comes from running the workshop's own code: the model of gpt.py, the
generate() of exercises 1 and 2 (whichever implementation the caller picked), the cost counter of
workshop/grading/harness.py. Nothing is typed in by hand.

    from workshop.figures.generation import measure_generation, plot_generation_cost
"""

import statistics
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
import torch
import torch.nn.functional as F

from workshop.grading.harness import count_model_work, synchronize

NO_EOS = -1  # a token id that never comes: every generate() call yields exactly max_new_tokens
NAIVE_COLOR, CACHED_COLOR, WRONG_COLOR = "tab:red", "tab:blue", "crimson"

# Sizes. A 16:9 Marp slide is 1280 x 720 px, i.e. 13.33 x 7.5 in at the browser's 96 px per inch.
# Each figure is drawn at the inch size at which its deck shows it (the deck's `![w:N]` is 96 x the
# figure's width in inches), so a font of f pt in the figure is f pt on the slide; nothing is below
# MIN_PT = 12 pt (16 px on the slide). A figure shown smaller than drawn shrinks its fonts by the same
# ratio: tests/test_slides.py checks min font x shown width / drawn width >= 12 from results/figures.json.
SLIDE_PX_PER_INCH = 96
MIN_PT, FONT, TITLE_PT = 12, 13, 14


def canvas(width, height):
    """A figure of width x height inches whose one axes is the whole figure, in inches from the top left
    (y grows downwards) and without ticks: for the diagrams drawn box by box."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    return fig, ax


def readable(fig, min_pt=MIN_PT):
    """Raise every text of `fig` (ticks, labels, legends, annotations) to at least min_pt points.
    The plotting functions call it last, so a figure is legible at the size the slides show it."""
    from matplotlib.text import Text

    for ax in fig.axes:
        ax.tick_params(labelsize=max(min_pt, FONT))
        for label in (ax.xaxis.label, ax.yaxis.label):
            label.set_fontsize(max(label.get_fontsize(), FONT))
    for text in fig.findobj(Text):
        if text.get_fontsize() < min_pt:
            text.set_fontsize(min_pt)
    return fig


def smallest_font(fig):
    """The smallest font (pt) of any visible, non-empty text in `fig`, after drawing it."""
    from matplotlib.text import Text

    fig.canvas.draw()
    return min(t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip())


DPI = 200  # pixels per inch of a saved PNG; the drawn inch size is the size shown


def save(fig, path, dpi=DPI):
    """Save `fig` as a PNG at `dpi` and close it. Returns what it was drawn as: {"width_in", "height_in",
    "dpi", "smallest_font_pt"} (the decks' figures record it in results/figures.json)."""
    width, height = fig.get_size_inches()
    drawn = {"width_in": float(width), "height_in": float(height), "dpi": dpi, "smallest_font_pt": smallest_font(fig)}
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return drawn


# ----------------------------------------------------------------------------------------------
# Measuring

@dataclass
class GenerationCost:
    """What generating costs, per number of new tokens: median seconds and token-passes per label."""
    lengths: list
    seconds: dict  # {label: [median seconds for each length]}
    token_passes: dict  # {label: [token positions through the model for each length]}
    speedups: list = None  # the measured speed-up per length (median of paired ratios), when known

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

def plot_next_token(token_ids, probs, tokenizer, prompt_text="", figsize=(8.5, 4.8)):
    """Horizontal bars of the most likely next tokens; the greedy choice (argmax) highlighted."""
    fig, ax = plt.subplots(figsize=figsize)
    labels = [repr(tokenizer.decode([t])) for t in token_ids]
    colors = [CACHED_COLOR if i == 0 else "lightgray" for i in range(len(token_ids))]
    ax.barh(range(len(token_ids)), probs, color=colors)
    ax.set_yticks(range(len(token_ids)), labels, fontfamily="monospace")
    ax.invert_yaxis()
    ax.set_xlabel("probability of the next token (softmax of the last logits)")
    title = "blue: the argmax, greedy decoding's choice"
    ax.set_title(f"next token after {prompt_text!r}\n({title})" if prompt_text else title, fontsize=TITLE_PT)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_positions_per_pass(passes_by_label, prompt_len, figsize=None):
    """One grid per generate function: row = forward pass, column = position; a filled cell is a
    position the pass computed. Naive fills a triangle (quadratic), the KV cache a diagonal (linear)."""
    labels = list(passes_by_label)
    fig, axes = plt.subplots(1, len(labels), figsize=figsize or (5.6 * len(labels), 4.4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        passes = passes_by_label[label]
        width = max(max(p) for p in passes) + 1
        grid = torch.zeros(len(passes), width)
        for row, positions in enumerate(passes):
            for pos in positions:
                grid[row, pos] = 1 if pos < prompt_len else 2
        ax.imshow(grid, cmap=_three_colors(), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        total = sum(len(p) for p in passes)
        ax.set_title(f"{label}: {total} token-passes", fontsize=TITLE_PT)
        ax.set_xlabel("position (dark: prompt, light: new)")
        ax.set_ylabel("forward pass")
        ax.set_yticks(range(0, len(passes), 2), [str(i) for i in range(0, len(passes), 2)])
    readable(fig)
    fig.tight_layout()
    return fig


def plot_generation_cost(cost, prompt_len=None, title=None, figsize=(11.5, 4.2)):
    """Two panels against the number of new tokens: measured time, and token-passes (the counter),
    with the cost model's curves when prompt_len is given. Labels containing "naive" are drawn red."""
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=figsize)
    for label, seconds in cost.seconds.items():
        ax_t.plot(cost.lengths, seconds, "o-", color=_color(label), label=label)
    if len(cost.seconds) == 2:  # the speedup at the longest length
        slow, fast = (cost.seconds[label][-1] for label in cost.seconds)
        speedup = cost.speedups[-1] if cost.speedups else slow / fast  # the number the tables quote, when given
        ax_t.annotate(f"{speedup:.1f}x", (cost.lengths[-1], fast), textcoords="offset points", xytext=(-4, 8),
                      ha="right", fontsize=FONT, fontweight="bold", color=_color(list(cost.seconds)[1]))
    ax_t.set(xlabel="new tokens", ylabel="seconds (median)", title="wall clock")
    for label, passes in cost.token_passes.items():
        ax_c.plot(cost.lengths, passes, "o-", color=_color(label), label=label)
        ax_c.annotate(f"{passes[-1]:,}", (cost.lengths[-1], passes[-1]), textcoords="offset points", xytext=(-4, 6),
                      ha="right", fontsize=MIN_PT, color=_color(label))
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
        ax.legend(fontsize=MIN_PT)
    if title:
        fig.suptitle(title, fontsize=TITLE_PT)
    readable(fig)
    fig.tight_layout()
    return fig


def plot_causal_masks(causal_mask, cases=((6, 6), (3, 7), (1, 7)), figsize=(11.5, 4.9)):
    """Top row: what SDPA's is_causal=True lets each query see; bottom row: the lower-right aligned
    causal_mask(q_len, kv_len) of exercise 2 (None = no mask). Cells where is_causal disagrees with
    the correct pattern are crossed out. Queries are the LAST q_len positions of kv_len."""
    fig, axes = plt.subplots(2, len(cases), figsize=figsize, squeeze=False)
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
            ax.set_title(f"{name}\n{kind}: {verdict}", fontsize=FONT, color=WRONG_COLOR if wrong.any() else "black")
            ax.set_xticks(range(kv_len))
            ax.set_yticks(range(q_len), [str(kv_len - q_len + i) for i in range(q_len)])
            ax.set_xlabel("key position")
            ax.set_ylabel("query")
    readable(fig)
    fig.tight_layout()
    return fig


def plot_gpt2_block(model, seq_len=12, figsize=(11.5, 4.6)):
    """GPT-2 as gpt.py builds it, left to right, with the shapes of a [1, seq_len] input and the
    parameter count of each piece, read from `model` itself. The repeated block is drawn opened."""
    from matplotlib.patches import FancyBboxPatch

    c, T = model.config, seq_len
    n_params = lambda m: sum(p.numel() for p in m.parameters())
    block = model.transformer.h[0]
    head_dim = c.n_embd // c.n_head
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_xlim(0, 23)
    ax.set_ylim(-0.3, 10.9)
    ax.axis("off")

    def box(x, y, w, h, text, color):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", facecolor=color, edgecolor="0.3"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=MIN_PT)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5, color="0.3"))

    # outside the blocks: embeddings in, head out
    box(0.1, 6.3, 3.2, 2.6, f"wte + wpe\ntoken + position\nembeddings\n{n_params(model.transformer.wte) + n_params(model.transformer.wpe):,} params", "#dbe8f6")
    ax.text(1.7, 9.9, f"input_ids [1, {T}]\nposition_ids [1, {T}]", ha="center", va="center", fontsize=MIN_PT)
    box(19.6, 6.3, 3.3, 2.6, f"ln_f, lm_head\n{c.n_embd} → {c.vocab_size:,}\n{n_params(model.lm_head):,} params", "#f6dbdb")
    ax.text(21.25, 9.9, f"logits [1, {T}, {c.vocab_size:,}]", ha="center", va="center", fontsize=MIN_PT)
    # the block, opened: pre-norm attention and MLP, each with a residual connection
    ax.add_patch(FancyBboxPatch((4.0, 0.4), 15.0, 10.0, boxstyle="round,pad=0.1", facecolor="none", edgecolor="0.4", ls="--"))
    ax.text(11.5, 9.9, f"GPTBlock × {c.n_layer} (n_layer), {n_params(block):,} params each; x stays [1, {T}, {c.n_embd}]",
            ha="center", va="center", fontsize=FONT, weight="bold")
    box(4.4, 5.5, 2.0, 1.6, "ln_1", "#eeeeee")
    box(7.0, 4.6, 4.6, 3.4, f"attention\nc_attn {c.n_embd} → 3×{c.n_embd}\n{c.n_head} heads × {head_dim}\nq, k, v [1, {c.n_head}, {T}, {head_dim}]\nc_proj {c.n_embd} → {c.n_embd}", "#d8f0d8")
    box(12.2, 5.5, 1.2, 1.6, "+", "white")
    box(13.9, 1.4, 2.2, 1.6, "ln_2", "#eeeeee")
    box(16.6, 0.9, 2.2, 2.6, f"MLP\n{c.n_embd} → {4 * c.n_embd}\nGELU\n→ {c.n_embd}", "#fbecd0")
    box(16.9, 5.5, 1.2, 1.6, "+", "white")
    arrow(3.4, 7.6, 4.3, 6.3)
    arrow(6.5, 6.3, 6.9, 6.3)
    arrow(11.7, 6.3, 12.1, 6.3)
    ax.plot([3.4, 12.8], [8.7, 8.7], color="0.5", lw=1.2)  # the residual path skips attention...
    ax.annotate("", (12.8, 7.2), (12.8, 8.7), arrowprops=dict(arrowstyle="->", lw=1.2, color="0.5"))
    ax.text(9.0, 8.8, "residual", fontsize=MIN_PT, color="0.4", ha="center", va="bottom")
    arrow(13.5, 6.1, 14.9, 3.1)
    arrow(16.2, 2.2, 16.5, 2.2)
    arrow(18.3, 3.6, 17.6, 5.4)
    ax.annotate("", (16.8, 6.3), (13.5, 6.3), arrowprops=dict(arrowstyle="->", lw=1.2, color="0.5"))
    ax.text(15.1, 6.6, "residual", fontsize=MIN_PT, color="0.4", ha="center")
    arrow(18.2, 6.3, 19.5, 7.4)
    ax.text(11.5, -0.1, f"{model.num_parameters():,} parameters in all; attention is the only place where positions see each other",
            ha="center", va="center", fontsize=MIN_PT, color="0.3")
    readable(fig)
    fig.tight_layout()
    return fig


def generation_steps(model, generate, prompt_ids, max_new_tokens):
    """What one generate() call feeds the model and gets back, pass by pass: a list of
    (number of input positions, next token id). Recorded with a hook on the position embedding."""
    lengths = []
    hook = model.transformer.wpe.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[1]))
    try:
        tokens = generate(model, prompt_ids, max_new_tokens, NO_EOS)
    finally:
        hook.remove()
    return list(zip(lengths, tokens))


def plot_generation_loop(prompt_ids, steps, tokenizer, vocab_size, figsize=(11.5, 4.4)):
    """The naive greedy loop as it ran: one row per step, the sequence fed in (prompt dark, earlier
    outputs light), and the token the argmax of the last logits picked, appended for the next step."""
    shown_prompt = 3  # the prompt's last tokens; the rest is summarised as "…"
    fig, ax = plt.subplots(figsize=figsize)
    cell = 1.0
    for row, (n_in, token) in enumerate(steps):
        outputs = [t for _, t in steps[:row]]
        seq = prompt_ids[-shown_prompt:] + outputs
        x = 1.0
        ax.text(0.5, row + 0.5, "…", ha="center", va="center", fontsize=FONT)
        for i, t in enumerate(seq):
            color = "#1f4e99" if i < shown_prompt else "#7fb2e5"
            ax.add_patch(Rectangle((x, row + 0.08), 1.8 * cell, 0.84, facecolor=color, alpha=0.45, edgecolor="white"))
            ax.text(x + 0.9, row + 0.5, _shown(tokenizer.decode([t])), ha="center", va="center", fontsize=MIN_PT, fontfamily="monospace")
            x += 1.85
        arrow_x = 1.85 * (shown_prompt + len(steps)) + 1.2
        ax.text(arrow_x, row + 0.5, f"→ logits [1, {n_in}, {vocab_size:,}] → argmax:",
                ha="left", va="center", fontsize=MIN_PT)
        ax.text(arrow_x + 10.6, row + 0.5, _shown(tokenizer.decode([token])), ha="left", va="center", fontsize=FONT,
                fontfamily="monospace", weight="bold", color="tab:red")
    ax.set_xlim(0, 1.85 * (shown_prompt + len(steps)) + 13.5)
    ax.set_ylim(len(steps), 0)
    ax.set_yticks([r + 0.5 for r in range(len(steps))], [f"step {r}: [1, {n}]" for r, (n, _) in enumerate(steps)])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(f"the loop, as it ran: the picked token is appended and the whole sequence goes in again "
                 f"(prompt: {len(prompt_ids)} tokens)", fontsize=FONT, loc="left")
    readable(fig)
    fig.tight_layout()
    return fig


def kv_cache_lengths(kv_module, model, prompt_ids, decode_steps):
    """Run exercise 2's forward with a KVCache: a prefill of the prompt, then decode_steps single
    tokens. Returns, after each pass, every layer's key and value shapes: [[(k_shape, v_shape) per layer] per pass]."""
    kv_cache = kv_module.KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    shapes = []
    with torch.no_grad():
        for _ in range(decode_steps + 1):
            logits = kv_module.forward(model, input_ids, position_ids, kv_cache)
            shapes.append([(tuple(k.shape), tuple(v.shape)) for k, v in zip(kv_cache.keys, kv_cache.values)])
            input_ids, position_ids = logits[:, -1:].argmax(-1), position_ids[:, -1:] + 1
    return shapes


def plot_kv_cache_growth(shapes, figsize=(11.5, 4.4)):
    """Every layer's K and V, one row each, one cell per cached position: coloured by the pass that
    wrote it (the prefill, then one decode step each). The shapes are those measured."""
    n_layer, passes = len(shapes[0]), len(shapes)
    width = shapes[-1][0][0][2]
    fig, ax = plt.subplots(figsize=figsize)
    cmap = plt.get_cmap("Blues")
    for p, per_layer in enumerate(shapes):
        start = 0 if p == 0 else shapes[p - 1][0][0][2]
        color = "#1f4e99" if p == 0 else cmap(0.25 + 0.6 * p / passes)
        for layer, (k, v) in enumerate(per_layer):
            for r, shape in ((2 * layer, k), (2 * layer + 1, v)):
                for pos in range(start, shape[2]):
                    ax.add_patch(Rectangle((pos, r + 0.1), 1, 0.8, facecolor=color, edgecolor="white"))
    for layer, (k, v) in enumerate(shapes[-1]):
        for r, name, shape in ((2 * layer, "K", k), (2 * layer + 1, "V", v)):
            ax.text(width + 0.4, r + 0.5, f"{name} {list(shape)}", va="center", fontsize=MIN_PT, fontfamily="monospace")
    prompt = shapes[0][0][0][2]
    ax.text(prompt / 2, -0.35, f"prefill: {prompt} positions at once", ha="center", fontsize=MIN_PT)
    ax.text(prompt + (width - prompt) / 2, -0.35, "decode: +1 per step", ha="center", fontsize=MIN_PT)
    ax.set_xlim(0, width + 9)
    ax.set_ylim(2 * n_layer, -1)
    ax.set_yticks([r + 0.5 for r in range(2 * n_layer)], [f"layer {r // 2} {'KV'[r % 2]}" for r in range(2 * n_layer)])
    ax.set_xticks([i + 0.5 for i in range(0, width, 2)], [str(i) for i in range(0, width, 2)])
    ax.set_xlabel("cached position (the T dimension of [B, n_head, T, head_dim])")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    readable(fig)
    fig.tight_layout()
    return fig


def measure_prefill_decode(kv_module, model, lengths, repeats=5, seed=0):
    """Median seconds of one forward pass of exercise 2's forward at each context length T:
    a prefill of T tokens, and a decode step of 1 token against a cache of T. Returns
    {"lengths", "prefill_s", "decode_s"} (lists, one value per length)."""
    g = torch.Generator().manual_seed(seed)
    out = {"lengths": list(lengths), "prefill_s": [], "decode_s": []}
    with torch.no_grad():
        for T in lengths:
            ids = torch.randint(0, model.config.vocab_size, (1, T + 1), generator=g).to(model.device)
            pos = torch.arange(T + 1, device=model.device)[None]
            prefill, decode = [], []
            for _ in range(repeats + 1):  # the first round warms up and is dropped
                cache = kv_module.KVCache(model.config.n_layer)
                synchronize(model.device)
                start = time.perf_counter()
                kv_module.forward(model, ids[:, :T], pos[:, :T], cache)
                synchronize(model.device)
                mid = time.perf_counter()
                kv_module.forward(model, ids[:, T:], pos[:, T:], cache)
                synchronize(model.device)
                prefill.append(mid - start)
                decode.append(time.perf_counter() - mid)
            out["prefill_s"].append(statistics.median(prefill[1:]))
            out["decode_s"].append(statistics.median(decode[1:]))
    return out


def plot_prefill_decode(timing, title=None, figsize=(11.5, 4.2)):
    """Left: one forward pass, prefill of T tokens against one decode step with T cached. Right: the
    same per token produced or processed: prefill spreads each weight read over T tokens, decode does not."""
    T, pre, dec = timing["lengths"], timing["prefill_s"], timing["decode_s"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
    ax1.plot(T, [s * 1e3 for s in pre], "o-", color=NAIVE_COLOR, label="prefill of T tokens")
    ax1.plot(T, [s * 1e3 for s in dec], "s-", color=CACHED_COLOR, label="decode 1 token, T cached")
    ax1.set(xlabel="T (tokens)", ylabel="ms per forward pass (median)", title="one forward pass")
    ax2.plot(T, [s / t * 1e3 for s, t in zip(pre, T)], "o-", color=NAIVE_COLOR, label="prefill: ms / T")
    ax2.plot(T, [s * 1e3 for s in dec], "s-", color=CACHED_COLOR, label="decode: ms per token")
    ax2.set(xlabel="T (tokens)", ylabel="ms per token (log scale)", title="per token", yscale="log")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(T, [str(t) for t in T])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=MIN_PT)
    ax1.set_ylim(bottom=0)
    if title:
        fig.suptitle(title, fontsize=TITLE_PT)
    readable(fig)
    fig.tight_layout()
    return fig


def measure_chunked_prefill(kv_module, model, prompt_ids, chunk):
    """Feed prompt_ids to exercise 2's forward in chunks of `chunk` tokens, once with its own
    causal_mask (lower-right aligned) and once with the upper-left triangle that is_causal=True
    builds, and compare each with a one-piece prefill. Returns {"lower_right_max_diff",
    "upper_left_max_diff", "upper_left_argmax_changed"} (the last: fraction of positions)."""
    from unittest import mock

    def upper_left(q_len, kv_len, device):
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()

    def chunked():
        cache, parts = kv_module.KVCache(model.config.n_layer), []
        for start in range(0, len(prompt_ids), chunk):
            ids = torch.tensor([prompt_ids[start:start + chunk]], device=model.device)
            parts.append(kv_module.forward(model, ids, torch.arange(start, start + ids.shape[1], device=model.device)[None], cache))
        return torch.cat(parts, dim=1)

    with torch.no_grad():
        ids = torch.tensor([prompt_ids], device=model.device)
        whole = kv_module.forward(model, ids, torch.arange(len(prompt_ids), device=model.device)[None],
                                  kv_module.KVCache(model.config.n_layer))
        right = chunked()
        with mock.patch.object(kv_module, "causal_mask", upper_left):
            left = chunked()
    return {"lower_right_max_diff": (right - whole).abs().max().item(), "upper_left_max_diff": (left - whole).abs().max().item(),
            "upper_left_argmax_changed": (left.argmax(-1) != whole.argmax(-1)).float().mean().item()}


def _shown(text):
    """A token as printed in a figure: whitespace visible, nothing cut."""
    return text.replace("\n", "\\n").replace(" ", "␣")


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
