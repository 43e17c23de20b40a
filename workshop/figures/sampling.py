"""Decoding strategies (module 6), measured and drawn: shared by notebooks/06_decoding.ipynb and the
slides' figures (scripts/make_figures.py draws slides/figures/06_*.png with these same functions).

Every picture is a real run of exercise 6's code, whichever implementation the caller passes in:
`dec` is the module of the first part (workshop.grading.harness.implementation("ex6_decoding")): its logits
processors, its sampler and draws, its beam search, its StopChecker and generate; `con` the module of
constrained decoding (implementation("ex6_constrained")). The engine whose sampling cost is measured
is exercise 5's (or 4's), which always samples with the reference sampler.
"""

import statistics
import textwrap
import time

import matplotlib.pyplot as plt
import torch

from workshop.figures.generation import FONT, MIN_PT, TITLE_PT, canvas, readable

COURSE_PROMPT = "The quick brown fox jumps over the"  # the course's example: the tiny model is unsure here
PEAKED_PROMPT = "ROMEO:\nI will"  # a prompt after which the tiny model is surer of itself
KEPT_COLOR, DROPPED_COLOR, CROSSING_COLOR = "tab:blue", "0.85", "tab:red"
MONO = "DejaVu Sans Mono"

# The processors shown one at a time, each applied alone to the raw logits: (label, processor, value).
PANELS = [("raw logits (T = 1)", None, None), ("temperature 0.7", "temperature", 0.7), ("temperature 1.5", "temperature", 1.5),
          ("top-k 5", "top_k", 5), ("top-p 0.4", "top_p", 0.4), ("min-p 0.2", "min_p", 0.2)]
# Typical settings, for the counts of tokens each keeps: (key in results, processor, value).
TYPICAL = [("top_k_50", "top_k", 50), ("top_p_90", "top_p", 0.9), ("top_p_50", "top_p", 0.5), ("min_p_10", "min_p", 0.1),
           ("min_p_20", "min_p", 0.2)]


def show(text):
    """A piece of text as a slide can show it: newlines as ↵, a lone or leading/trailing space as ␣."""
    text = text.replace("\n", "↵")
    if text.strip() != text:
        text = ("␣" if text.startswith(" ") else "") + text.strip(" ") + ("␣" if text.endswith(" ") and text.strip() else "")
    return text or "∅"


# ----------------------------------------------------------------------------------------------
# The next-token distribution, before and after each processor

@torch.no_grad()
def next_token_logits(model, prompt_ids):
    """The model's logits [V] (float32, on the CPU) for the token after prompt_ids."""
    ids = torch.tensor([prompt_ids], device=model.device)
    return model(ids, torch.arange(len(prompt_ids), device=model.device)[None])[0, -1].float().cpu()


def apply(dec, logits, processor, value):
    """One processor of exercise 6 (apply_temperature, apply_top_k, ...) on one row of logits [V]."""
    if processor is None:
        return logits.clone()
    return getattr(dec, f"apply_{processor}")(logits[None].clone(), [value])[0]


def kept(logits):
    """How many tokens a processed row still allows (finite logits)."""
    return int(torch.isfinite(logits).sum())


def processor_views(dec, logits, panels=PANELS):
    """Each panel's processor applied alone to the raw logits: [{"label", "processor", "value", "probs", "kept"}]."""
    views = []
    for label, processor, value in panels:
        out = apply(dec, logits, processor, value)
        views.append({"label": label, "processor": processor, "value": value, "probs": out.softmax(-1), "kept": kept(out)})
    return views


def keep_counts(dec, logits, settings=TYPICAL):
    """{key: tokens kept} for each (key, processor, value) of `settings`, applied alone to the raw logits."""
    return {key: kept(apply(dec, logits, processor, value)) for key, processor, value in settings}


def plot_processors(views, tokenizer, top=10, figsize=(11.5, 5.6)):
    """One panel per processor: the probabilities of the raw distribution's `top` most likely tokens
    after it (grey: removed), and how many of the vocabulary's tokens it keeps. Top-p's crossing token
    (the least likely token it keeps, the one that takes the kept mass to p) is red."""
    raw = views[0]["probs"]
    order = raw.topk(top).indices.tolist()
    labels = [repr(tokenizer.decode([t])) for t in order]
    cols = 3
    rows = -(-len(views) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=figsize, sharey=True, sharex=True)
    most = max(float(v["probs"].max()) for v in views) * 100
    for ax, view in zip(axes.flat, views):
        probs = view["probs"][order]
        allowed = probs > 0
        colors = [KEPT_COLOR if a else DROPPED_COLOR for a in allowed.tolist()]
        ax.barh(range(top), (probs * 100).tolist(), color=colors)
        if view["processor"] == "top_p" and view["kept"] <= top:  # the token that takes the kept mass to p
            crossing = view["kept"] - 1
            ax.barh([crossing], [float(probs[crossing]) * 100], color=CROSSING_COLOR)
            ax.text(float(probs[crossing]) * 100 + 1, crossing, f"crosses p = {view['value']}", va="center", fontsize=MIN_PT,
                    color=CROSSING_COLOR)
        for i, a in enumerate(allowed.tolist()):
            if not a:
                ax.text(0.5, i, "removed", va="center", fontsize=MIN_PT, color="0.45")
        ax.set_xlim(0, most * 1.15)
        ax.set_title(f"{view['label']}: keeps {view['kept']:,}", fontsize=FONT, loc="left")
        ax.grid(alpha=0.3, axis="x")
    for ax in axes.flat[len(views):]:
        ax.axis("off")
    axes[0, 0].set_yticks(range(top), labels)
    axes[0, 0].invert_yaxis()
    for ax in axes[:, 0]:
        for label in ax.get_yticklabels():
            label.set_fontfamily(MONO)
    for ax in axes[-1]:
        ax.set_xlabel("probability (%)")
    readable(fig)
    fig.tight_layout(h_pad=1.2)
    return fig


# ----------------------------------------------------------------------------------------------
# Texts: temperatures, greedy repeating itself, beam search against greedy and sampling

def sample_texts(dec, model, tokenizer, prompt_ids, temperatures, seeds, max_new_tokens):
    """{temperature: [text for each seed]}: exercise 6's generate with SamplingParams(temperature, seed)."""
    return {t: [dec.generate(model, tokenizer, prompt_ids, max_new_tokens, dec.SamplingParams(temperature=t, seed=s), stop_token_ids=()).text
                for s in seeds] for t in temperatures}


def distinct_ngrams(tokens, n=3):
    """The share of a text's token n-grams that occur only once in it: 1 = no repeats; a loop drives it down."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return sum(grams.count(g) == 1 for g in grams) / len(grams) if grams else 1.0


def repetition(dec, model, tokenizer, prompt_ids, max_new_tokens, penalty=1.3, temperature=0.8, seed=0):
    """Greedy, greedy with a repetition penalty, and a sample: [{"label", "tokens", "text", "distinct_3grams"}]."""
    settings = [("greedy", dec.GREEDY), (f"greedy, repetition penalty {penalty}", dec.SamplingParams(temperature=0.0, repetition_penalty=penalty)),
                (f"sampled, T = {temperature}, seed {seed}", dec.SamplingParams(temperature=temperature, seed=seed))]
    rows = []
    for label, params in settings:
        out = dec.generate(model, tokenizer, prompt_ids, max_new_tokens, params, stop_token_ids=())
        rows.append({"label": label, "tokens": out.token_ids, "text": out.text, "distinct_3grams": distinct_ngrams(out.token_ids)})
    return rows


@torch.no_grad()
def sequence_logprob(model, prompt_ids, tokens):
    """The model's total log-probability of `tokens` after prompt_ids (one full float32 forward)."""
    ids = list(prompt_ids) + list(tokens)
    logp = model(torch.tensor([ids], device=model.device), torch.arange(len(ids), device=model.device)[None])[0].float().log_softmax(-1)
    steps = torch.arange(len(prompt_ids) - 1, len(ids) - 1, device=model.device)
    return float(logp[steps, torch.tensor(tokens, device=model.device)].sum())


def beam_vs_greedy(dec, model, tokenizer, prompt_ids, max_new_tokens, widths=(2, 4, 8), seeds=(0, 1, 2), temperature=0.8):
    """Greedy, beam search of each width (its best hypothesis) and seeded samples, all of max_new_tokens:
    [{"label", "key", "tokens", "text", "logprob"}], logprob the total log-probability under the model."""
    runs = [("greedy", "greedy", dec.generate(model, tokenizer, prompt_ids, max_new_tokens, dec.GREEDY, stop_token_ids=()).token_ids)]
    for w in widths:
        runs.append((f"beam search, {w} beams", f"beam_{w}", dec.beam_search(model, prompt_ids, w, max_new_tokens)[0].tokens))
    for s in seeds:
        params = dec.SamplingParams(temperature=temperature, seed=s)
        runs.append((f"sampled, T = {temperature}, seed {s}", f"sampled_{s}",
                     dec.generate(model, tokenizer, prompt_ids, max_new_tokens, params, stop_token_ids=()).token_ids))
    return [{"label": label, "key": key, "tokens": tokens, "text": tokenizer.decode(tokens),
             "logprob": sequence_logprob(model, prompt_ids, tokens)} for label, key, tokens in runs]


@torch.no_grad()
def beam_trace(model, prompt_ids, num_beams, steps, eos_token_id=50256):
    """Beam search traced step by step for the picture, by exercise 6's rules (2 * num_beams candidates a
    step, in order; one ending in EOS finishes if it ranks among the first num_beams; the first num_beams
    others go on), with one plain forward per beam: [{"candidates": [{"parent", "token", "total", "status"}],
    "parents": [...]}], status "beam" (goes on), "finished" or "dropped"; parents: the old beam each new
    beam continues, i.e. the cache rows the next step gathers."""
    beams, trace = [([], 0.0)], []
    for step in range(steps):
        rows = []
        for tokens, _ in beams:
            ids = torch.tensor([list(prompt_ids) + tokens], device=model.device)
            rows.append(model(ids, torch.arange(ids.shape[1], device=model.device)[None])[0, -1].float().cpu().log_softmax(-1))
        totals = torch.tensor([total for _, total in beams])[:, None] + torch.stack(rows)
        top = totals.flatten().topk(2 * num_beams)
        candidates, next_beams, parents = [], [], []
        for rank, (total, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            parent, token = divmod(index, totals.shape[1])
            if token == eos_token_id or step + 1 == steps:
                status = "finished" if rank < num_beams else "dropped"
            elif len(next_beams) < num_beams:
                status = "beam"
                next_beams.append((beams[parent][0] + [token], total))
                parents.append(parent)
            else:
                status = "dropped"
            candidates.append({"parent": parent, "token": token, "total": total, "status": status})
        trace.append({"candidates": candidates, "parents": parents})
        beams = next_beams
    return trace


def beam_path(trace, rank=0):
    """The tokens of the traced candidate at `rank` of the last step, followed back through its parents."""
    tokens, step, row = [], len(trace) - 1, rank
    while step >= 0:
        c = trace[step]["candidates"][row]
        tokens.insert(0, c["token"])
        if step:
            row = [i for i, d in enumerate(trace[step - 1]["candidates"]) if d["status"] == "beam"][c["parent"]]
        step -= 1
    return tokens


def plot_beam_search(trace, tokenizer, prompt_text, num_beams, figsize=(11.5, 4.6)):
    """The traced search as a tree: one column per step, its 2 * num_beams candidates by rank (token and
    total log-probability), a line from each to the beam it extends; blue: kept as a beam, grey: dropped,
    green: finished. Under each column, the parents that the next step's cache rows follow."""
    W, H = figsize
    fig, ax = canvas(W, H)
    ax.text(0.15, 0.3, f"num_beams = {num_beams}: each step scores every (beam, token), keeps the {2 * num_beams} best candidates; "
            f"the best {num_beams} go on", fontsize=FONT, weight="bold", va="center")
    cols = len(trace) + 1
    col_w = (W - 0.3) / cols
    box_w, box_h, top_y = col_w - 0.45, 0.5, 0.85
    slots = 2 * num_beams
    gap = (H - top_y - 1.15) / slots
    colors = {"beam": ("#d6e6f5", KEPT_COLOR), "dropped": ("0.93", "0.6"), "finished": ("#d9f0d3", "tab:green")}

    def centre(col, row, rows):
        return 0.15 + col * col_w + box_w / 2, top_y + (row + 0.5) * gap * slots / rows

    prompt_xy = centre(0, 0, 1)
    ax.add_patch(plt.Rectangle((prompt_xy[0] - box_w / 2, prompt_xy[1] - box_h / 2), box_w, box_h, facecolor="0.85", edgecolor="0.3"))
    ax.text(*prompt_xy, "prompt\n" + show(prompt_text)[-16:], fontsize=MIN_PT, ha="center", va="center", fontfamily=MONO)
    beam_xy = [prompt_xy]  # where each current beam's box is
    for step, entry in enumerate(trace):
        col, next_xy = step + 1, []
        for row, c in enumerate(entry["candidates"]):
            x, y = centre(col, row, slots)
            fill, edge = colors[c["status"]]
            px, py = beam_xy[c["parent"]]
            ax.plot([px + box_w / 2, x - box_w / 2], [py, y], color=edge, lw=2.2 if c["status"] != "dropped" else 1.0, zorder=1)
            ax.add_patch(plt.Rectangle((x - box_w / 2, y - box_h / 2), box_w, box_h, facecolor=fill, edgecolor=edge, lw=1.5, zorder=2))
            ax.text(x, y - 0.11, show(tokenizer.decode([c["token"]]))[:12], fontsize=MIN_PT, ha="center", va="center",
                    fontfamily=MONO, zorder=3, color="black" if c["status"] != "dropped" else "0.45")
            ax.text(x, y + 0.13, f"{c['total']:.2f}", fontsize=MIN_PT, ha="center", va="center", zorder=3, color="0.3")
            if c["status"] == "beam":
                next_xy.append((x, y))
        if entry["parents"]:
            ax.text(centre(col, 0, 1)[0], H - 0.75, f"cache rows ← {entry['parents']}", fontsize=MIN_PT, ha="center", va="center",
                    color=KEPT_COLOR)
        beam_xy = next_xy
    ax.text(0.15, H - 0.3, "blue: a beam (its cache row is gathered from its parent's)   grey: dropped   green: finished   "
            "number: total log-probability", fontsize=MIN_PT, va="center", color="0.25")
    readable(fig)
    return fig


def plot_texts(rows, title=None, value=None, value_label=None, figsize=(11.5, None)):
    """A column of texts, one row each ({"label", "text"}), newlines shown as ↵, wrapped to the width
    left (two lines at most); with `value` (a key of the rows, e.g. the log-probability), a bar per row
    on the left, as long as the value's magnitude."""
    W = figsize[0]
    bar_w = 2.0 if value else 0
    label_w = max(len(r["label"]) for r in rows) * 0.092 + 0.3  # 12 pt bold: about 0.1 in a character
    x_text = 0.1 + bar_w + label_w
    width = int((W - x_text - 0.15) / 0.1)  # 12 pt monospace: 0.1 in a character
    wrapped = [textwrap.wrap(show(r["text"]).replace("␣", " ").strip() or "∅", width)[:2] for r in rows]
    row_h, gap = 0.26, 0.2
    height = figsize[1] or 0.25 + sum(len(w) * row_h + gap for w in wrapped) + (0.45 if title else 0) + (0.4 if value else 0)
    fig, ax = canvas(W, height)
    y = 0.15
    if title:
        ax.text(0.1, y + 0.12, title, fontsize=TITLE_PT, weight="bold", va="center")
        y += 0.45
    if value:
        biggest = max(abs(r[value]) for r in rows)
        ax.text(0.1, y + 0.12, value_label or value, fontsize=MIN_PT, va="center", color="0.3")
        y += 0.4
    for r, w in zip(rows, wrapped):
        if value:
            length = (bar_w - 0.75) * abs(r[value]) / biggest
            color = "tab:orange" if "beam" in r["label"] else KEPT_COLOR if "greedy" in r["label"] else "0.6"
            ax.add_patch(plt.Rectangle((0.1, y + 0.03), length, row_h * 0.8, color=color))
            ax.text(0.15 + length, y + row_h / 2, f"{r[value]:.1f}", fontsize=MIN_PT, va="center")
        ax.text(0.1 + bar_w, y + row_h / 2, r["label"], fontsize=MIN_PT, va="center", weight="bold")
        for i, line in enumerate(w):
            ax.text(x_text, y + (i + 0.5) * row_h, line, fontsize=MIN_PT, va="center", fontfamily=MONO)
        y += len(w) * row_h + gap
        ax.plot([0.1, W - 0.1], [y - gap / 2, y - gap / 2], color="0.9", lw=1)
    readable(fig)
    return fig


# ----------------------------------------------------------------------------------------------
# Stopping: a stop string across token boundaries, and what streaming may show

def stream_steps(dec, tokenizer, token_ids, stop, max_new_tokens=None):
    """Feed `token_ids` one at a time to exercise 6's StopChecker: [{"token", "piece", "held", "finished"}],
    piece the text add() returned (safe to show), held the text decoded so far but not yet shown."""
    checker = dec.StopChecker(tokenizer, stop, stop_token_ids=(), max_new_tokens=max_new_tokens)
    steps, streamed = [], ""
    for i, token in enumerate(token_ids):
        piece = checker.add(token)
        streamed += piece
        decoded = tokenizer.decode(token_ids[:i + 1])
        steps.append({"token": tokenizer.decode([token]), "piece": piece, "held": "" if checker.finished else decoded[len(streamed):],
                      "finished": checker.finished, "text": streamed})
        if checker.finished:
            break
    return steps, checker


def plot_streaming(steps, stop, final_text=None, figsize=(11.5, None)):
    """A table in two halves, one row per new token: the token, the text streamed at that step, the
    text held back (it might still be the start of the stop string), and where the stop string completed."""
    row_h = 0.3
    half = -(-len(steps) // 2)
    height = figsize[1] or 0.8 + row_h * (half + 1) + (0.45 if final_text is not None else 0)
    fig, ax = canvas(figsize[0], height)
    ax.text(0.15, 0.3, f"stop string {stop!r}: no part of it ever reaches the client", fontsize=FONT, weight="bold", va="center")
    cols = [("step", 0.0), ("new token", 0.6), ("streamed now", 1.85), ("held back", 3.7)]
    for block in range(2):
        x0, y = 0.15 + block * 5.75, 0.75
        for name, x in cols:
            ax.text(x0 + x, y, name, fontsize=MIN_PT, weight="bold", va="center")
        for i in range(block * half, min(len(steps), (block + 1) * half)):
            s = steps[i]
            y += row_h
            ax.text(x0 + cols[0][1], y, str(i), fontsize=MIN_PT, va="center")
            ax.text(x0 + cols[1][1], y, show(s["token"]), fontsize=MIN_PT, va="center", fontfamily=MONO)
            ax.text(x0 + cols[2][1], y, show(s["piece"]) if s["piece"] else "-", fontsize=MIN_PT, va="center", fontfamily=MONO,
                    color="black" if s["piece"] else "0.6")
            if s["finished"]:
                ax.text(x0 + cols[3][1], y, "stop string: cut", fontsize=MIN_PT, va="center", color=CROSSING_COLOR)
            elif s["held"]:
                ax.text(x0 + cols[3][1], y, show(s["held"]), fontsize=MIN_PT, va="center", fontfamily=MONO, color="tab:orange")
    if final_text is not None:
        ax.text(0.15, 0.75 + row_h * (half + 1) + 0.2, "the final text = all the pieces streamed: ", fontsize=MIN_PT, va="center")
        ax.text(3.6, 0.75 + row_h * (half + 1) + 0.2, show(final_text), fontsize=MIN_PT, va="center", fontfamily=MONO)
    readable(fig)
    return fig


# ----------------------------------------------------------------------------------------------
# The sampler: do the draws follow the distribution? (a chi-square goodness-of-fit test)

def chi_square(counts, probs):
    """(statistic, degrees of freedom, p-value) of observed counts against probabilities (p > 0 only)."""
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, p


def draw_counts(dec, probs, draws, seed=0):
    """{draw name: counts per token} for draw_multinomial and draw_exponential_race, `draws` rows of
    probs [V] each, one generator per method, seeded `seed` and `seed + 1`: independent draws (with one
    seed, PyTorch's multinomial of one sample and the race give the same tokens: same_seed_same_tokens)."""
    rows = probs[None].expand(draws, -1).contiguous()
    counts = {}
    for i, name in enumerate(("draw_multinomial", "draw_exponential_race")):
        generator = torch.Generator().manual_seed(seed + i)
        tokens = getattr(dec, name)(rows, [generator] * draws)
        counts[name] = torch.bincount(torch.tensor(tokens), minlength=len(probs)).tolist()
    return counts


def same_seed_same_tokens(dec, probs, draws=1000, seed=0):
    """Whether draw_multinomial and draw_exponential_race, each with a generator seeded `seed`, draw the
    same tokens: in PyTorch, torch.multinomial(p, 1) is itself computed as the race argmax(p / E)."""
    rows = probs[None].expand(draws, -1).contiguous()
    return (dec.draw_multinomial(rows, [torch.Generator().manual_seed(seed)] * draws)
            == dec.draw_exponential_race(rows, [torch.Generator().manual_seed(seed)] * draws))


def plot_chi_square(labels, probs, counts, figsize=(11.5, 4.0)):
    """Side by side, per draw method: the counts (bars) against the expected counts (black ticks), with
    the chi-square statistic and its p-value."""
    fig, axes = plt.subplots(1, len(counts), figsize=figsize, sharey=True)
    names = {"draw_multinomial": "draw_multinomial: torch.multinomial", "draw_exponential_race": "draw_exponential_race: argmax p / E"}
    draws = sum(next(iter(counts.values())))
    expected = [p * draws for p in probs]
    x = range(len(probs))
    for ax, (name, c) in zip(axes, counts.items()):
        stat, dof, p = chi_square(c, probs)
        ax.bar(x, c, color=KEPT_COLOR, width=0.75, label="drawn")
        ax.scatter(x, expected, marker="_", s=500, color="black", lw=2, label="expected", zorder=3)
        ax.set_xticks(list(x), labels, fontfamily=MONO, rotation=40, ha="right")
        ax.set_title(f"{names.get(name, name)}\nχ² = {stat:.1f}, {dof} degrees of freedom, p = {p:.2f}", fontsize=FONT, loc="left")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel(f"count in {draws:,} draws")
    axes[0].legend(fontsize=MIN_PT, loc="upper right")
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Constrained decoding: the allowed tokens at each step

def constrained_run(con, model, tokenizer, prompt_ids, constraint, max_new_tokens, sampling=None):
    """Generate under `constraint` (exercise 6's constrained generate), then walk its states along the
    output: [{"token", "allowed"}] per new token (allowed: how many tokens the mask allowed before it),
    and the seconds of this run (masks built as they are first needed) and of a second, cached one."""
    kwargs = {} if sampling is None else {"sampling": sampling}
    start = time.perf_counter()
    out = con.generate(model, prompt_ids, constraint, max_new_tokens, **kwargs)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    again = con.generate(model, prompt_ids, constraint, max_new_tokens, **kwargs)
    cached_s = time.perf_counter() - start
    steps, state = [], constraint.start()
    for token in out:
        allowed = int(constraint.allowed(state).sum())
        eos = token == constraint.vocab.eos_token_id
        steps.append({"token": "EOS" if eos else tokenizer.decode([token]), "allowed": allowed})
        if not eos:
            state = constraint.advance(state, token)
    return {"tokens": out, "text": constraint.vocab.decode(out), "steps": steps, "first_s": first_s, "cached_s": cached_s,
            "same_again": again == out}


def plot_constrained(run, pattern, vocab_size, figsize=(11.5, 3.9)):
    """Bars: how many of the vocabulary's tokens the mask allowed at each step (log scale), the chosen
    token under each bar."""
    steps = run["steps"]
    fig, ax = plt.subplots(figsize=figsize)
    x = range(len(steps))
    ax.bar(x, [s["allowed"] for s in steps], color=KEPT_COLOR, width=0.7)
    ax.set_yscale("log")
    ax.set_ylim(0.7, vocab_size * 3)
    ax.axhline(vocab_size, color="0.4", ls="--", lw=1)
    ax.text(len(steps) - 0.5, vocab_size * 1.25, f"the whole vocabulary: {vocab_size:,}", ha="right", va="bottom", fontsize=MIN_PT)
    ax.set_xticks(list(x), [show(s["token"]) for s in steps], fontfamily=MONO)
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_ylabel("tokens allowed")
    ax.set_xlabel("the token chosen at each step (greedy among the allowed ones)")
    ax.set_title(f"regex {pattern}", fontsize=FONT, loc="left", fontfamily=MONO)
    ax.grid(alpha=0.3, axis="y")
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# What sampling costs: per row, and in an engine

def _median_ms(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def sampler_cost(dec, ex2, model, logits, settings, repeats=15, context=32):
    """Median milliseconds of dec.sample on one row of `logits` [V] for each (label, SamplingParams) of
    `settings`, and of one decode step of the model (exercise 2's forward: one token, a cache of
    `context` tokens) for scale: {label: ms, ..., "the model: a decode step": ms}."""
    row = logits[None].contiguous()
    out = {}
    for label, params in settings:
        generator = torch.Generator().manual_seed(0)
        out[label] = _median_ms(lambda: dec.sample(row, [params], [generator], [[0]]), repeats)
    cache = ex2.KVCache(model.config.n_layer)
    with torch.no_grad():
        ex2.forward(model, torch.zeros(1, context, dtype=torch.long, device=model.device),
                    torch.arange(context, device=model.device)[None], cache)
        keys, values = list(cache.keys), list(cache.values)

        def step():
            cache.keys, cache.values = list(keys), list(values)
            ex2.forward(model, torch.zeros(1, 1, dtype=torch.long, device=model.device),
                        torch.tensor([[context]], device=model.device), cache)
        out["the model: a decode step"] = _median_ms(step, repeats)
    return out


def engine_cost(engine, model, workload, max_batch_size, sampling, rounds=3):
    """Serve `workload` with an engine of exercise 4 or 5 (its Request takes sampling=...), all greedy
    and all sampled by `sampling` (request i seeded i), no EOS, taking turns (which goes first
    alternates); returns {"greedy": [tokens/s per round], "sampled": [...], "ratios": greedy/sampled per round,
    "ratio": their median, "tokens": generated tokens per run}."""
    from dataclasses import replace

    def run(params):
        requests = [engine.Request(p, n, sampling=params if params.greedy else replace(params, seed=i))
                    for i, (p, n) in enumerate(zip(workload.prompts, workload.max_new_tokens))]
        stats = engine.generate(model, requests, max_batch_size, eos_token_id=-1).stats
        return stats.generated_tokens, stats.generated_tokens / stats.elapsed_s

    greedy = engine.SamplingParams(temperature=0.0)
    run(greedy), run(sampling)  # warm up
    out = {"greedy": [], "sampled": []}
    for r in range(rounds):
        order = [("greedy", greedy), ("sampled", sampling)]
        for key, params in order if r % 2 == 0 else reversed(order):
            tokens, rate = run(params)
            out[key].append(rate)
    out["ratios"] = [g / s for g, s in zip(out["greedy"], out["sampled"])]
    out["ratio"] = statistics.median(out["ratios"])
    out["tokens"] = tokens
    return out


def plot_sampler_cost(per_row, engine, figsize=(11.5, 4.0)):
    """Left: one row's sampler time by setting against one decode step of the model. Right: the engine's
    tokens/s, all greedy against all sampled (each round, and the median ratio)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.35, 1]})
    labels = list(per_row)
    colors = ["0.55" if label.startswith("the model") else KEPT_COLOR for label in labels]
    ax1.barh(range(len(labels)), [per_row[k] for k in labels], color=colors)
    for i, k in enumerate(labels):
        ax1.text(per_row[k], i, f" {per_row[k]:.2f} ms", va="center", fontsize=MIN_PT)
    ax1.set_yticks(range(len(labels)), labels)
    ax1.invert_yaxis()
    ax1.set_xlim(0, max(per_row.values()) * 1.4)
    ax1.set_xlabel("milliseconds per row (median), 1 thread")
    ax1.set_title("one row of 50,257 logits through sample()", fontsize=FONT, loc="left")
    ax1.grid(alpha=0.3, axis="x")
    rounds = len(engine["greedy"])
    for key, color, dx in (("greedy", KEPT_COLOR, -0.2), ("sampled", "tab:orange", 0.2)):
        ax2.bar([r + dx for r in range(rounds)], engine[key], width=0.38, color=color, label=key)
    ax2.set_xticks(range(rounds), [str(r + 1) for r in range(rounds)])
    ax2.set_xlabel("round (the two take turns going first)")
    ax2.set_ylabel("generated tokens/s")
    ax2.set_ylim(0, max(engine["greedy"] + engine["sampled"]) * 1.35)
    ax2.set_title(f"the engine: greedy is {engine['ratio']:.1f}× as fast", fontsize=FONT, loc="left")
    ax2.legend(fontsize=MIN_PT, loc="upper right", ncol=2)
    ax2.grid(alpha=0.3, axis="y")
    readable(fig)
    fig.tight_layout()
    return fig
