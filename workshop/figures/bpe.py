"""Byte pair encoding (module 0), measured and drawn: shared by notebooks/00_bpe.ipynb and the slides' figures
(scripts/make_figures.py draws slides/figures/00_*.png with these same functions).

Every picture is a real run of exercise 0's code (`bpe` is the module the caller passes in, e.g.
workshop.grading.harness.implementation("ex0_bpe")): its learn_word_bpe on the course's corpus, its pretokenize,
byte alphabet and apply_merges on GPT-2's real merges, its train_byte_bpe on Shakespeare; the encoders'
speeds come from results/tokenizer.json (bench/tokenizer.py).
"""

from itertools import pairwise

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from workshop.tokenizers import ENCODERS, load_gpt2_bpe
from workshop.figures.generation import FONT, MIN_PT, TITLE_PT, canvas, readable

COURSE_CORPUS = {"old</w>": 7, "older</w>": 3, "finest</w>": 9, "lowest</w>": 4}
NEW_COLOR, LOST_COLOR, ZERO_COLOR, PIECE_COLORS = "#7fb2e5", "#f4c7c3", "0.88", ("#dbe9f6", "#fde9c9")


# ----------------------------------------------------------------------------------------------
# 0a: the course's worked example

def worked_example(bpe, corpus=COURSE_CORPUS, num_merges=5):
    """The course's example run by `bpe`: {"tokens": every token in order of appearance, "columns": [(title,
    table)] for the start and after each merge, "merges": [(pair, count)], "vocabulary": the cleaned one}."""
    learned = bpe.learn_word_bpe(dict(corpus), num_merges)
    columns = [("start", dict(learned.initial_table))]
    columns += [(f"+ {''.join(step.pair)}\n({step.count})", dict(step.table)) for step in learned.steps]
    tokens = list(dict.fromkeys(token for _, table in columns for token in table))
    return {"tokens": tokens, "columns": columns, "merges": [(tuple(s.pair), s.count) for s in learned.steps],
            "vocabulary": dict(learned.vocabulary)}


def plot_worked_example(example, figsize=(11.5, 5.3)):
    """The frequency table after each merge, one column per merge: the new token blue, the parts that lost
    counts red, tokens at 0 grey; the last column is the cleaned vocabulary."""
    tokens, columns = example["tokens"], example["columns"]
    W, H = figsize
    fig, ax = canvas(W, H)
    name_w, cell_w, head_h = 1.25, (W - 1.45 - 1.3) / len(columns), 0.62
    row_h = (H - head_h - 0.2) / len(tokens)
    vocab_x = 0.1 + name_w + len(columns) * cell_w + 0.1
    ax.text(0.1 + name_w / 2, 0.1 + head_h / 2, "token", ha="center", va="center", fontsize=FONT, weight="bold")
    ax.text(vocab_x + 0.55, 0.1 + head_h / 2, "vocabulary", ha="center", va="center", fontsize=FONT, weight="bold")
    previous = {}
    for c, (title, table) in enumerate(columns):
        x = 0.1 + name_w + c * cell_w
        ax.text(x + cell_w / 2, 0.1 + head_h / 2, title, ha="center", va="center", fontsize=MIN_PT, weight="bold", linespacing=1.1)
        for r, token in enumerate(tokens):
            y = 0.1 + head_h + r * row_h
            if token not in table:
                continue
            value, before = table[token], previous.get(token)
            color = (NEW_COLOR if before is None and c > 0 else LOST_COLOR if before is not None and value < before
                     else ZERO_COLOR if value == 0 else "white")
            ax.add_patch(Rectangle((x, y), cell_w, row_h, facecolor=color, edgecolor="0.6", lw=0.8))
            ax.text(x + cell_w / 2, y + row_h / 2, str(value), ha="center", va="center", fontsize=MIN_PT,
                    color="0.45" if value == 0 else "black")
        previous = table
    for r, token in enumerate(tokens):
        y = 0.1 + head_h + r * row_h
        ax.text(0.1 + name_w - 0.12, y + row_h / 2, token, ha="right", va="center", fontsize=MIN_PT, family="monospace")
        if token in example["vocabulary"]:
            ax.text(vocab_x + 0.55, y + row_h / 2, "kept", ha="center", va="center", fontsize=MIN_PT, color="tab:blue")
    return readable(fig)


def worked_example_record(example):
    """The worked example as plain JSON for results/figures.json: the tokens in order of appearance, then per
    column (start, each merge) its title and table, and the cleaned vocabulary's tokens."""
    return {"tokens": example["tokens"],
            "columns": [{"title": title.replace("\n", " "), "table": table} for title, table in example["columns"]],
            "kept": [token for token in example["tokens"] if token in example["vocabulary"]]}


def worked_example_markdown(record):
    """The frequency table after each merge as a Markdown table (one row per merge, one column per token, so that
    it fits a slide): the new token's count in bold, a part that lost counts marked ↓, not yet made: empty; the
    last row marks the cleaned vocabulary's tokens. `record`: results/figures.json's bpe_worked_example (its
    merges and worked_example_record()'s keys)."""
    tokens = record["tokens"]
    rows = ["| after | " + " | ".join(f"`{token}`" for token in tokens) + " |", "|---" * (len(tokens) + 1) + "|"]
    previous = {}
    for c, column in enumerate(record["columns"]):
        cells = []
        for token in tokens:
            value, before = column["table"].get(token), previous.get(token)
            cells.append("" if value is None else f"**{value}**" if before is None and c > 0
                         else f"{value}↓" if before is not None and value < before else str(value))
        merge = record["merges"][c - 1] if c else None
        title = f"+ `{merge['pair'].replace(' ', '')}` ({merge['count']})" if merge else column["title"]
        rows.append(f"| {title} | " + " | ".join(cells) + " |")
        previous = column["table"]
    rows.append("| vocabulary | " + " | ".join("✓" if token in record["kept"] else "" for token in tokens) + " |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------
# 0b: GPT-2's pipeline on a sentence, and one word's merges

def pipeline(bpe, text):
    """What each stage of GPT-2's tokenizer makes of `text`, with `bpe`'s functions and GPT-2's real merges:
    [{"piece", "bytes" (in the byte alphabet), "tokens", "ids"}] per pre-token."""
    encoder, merges = load_gpt2_bpe()
    ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
    byte_encoder = bpe.bytes_to_unicode()
    rows = []
    for piece in bpe.pretokenize(text):
        word = "".join(byte_encoder[b] for b in piece.encode("utf-8"))
        tokens = list(bpe.apply_merges(word, ranks))
        rows.append({"piece": piece, "bytes": word, "tokens": tokens, "ids": [encoder[t] for t in tokens]})
    return rows


def plot_pipeline(rows, figsize=(12.4, 3.6)):
    """Three bands: the pre-tokens as GPT-2's regex cuts them, each in the byte alphabet (a space is Ġ), and the
    tokens that the ranked merges leave, with their ids."""
    W, H = figsize
    fig, ax = canvas(W, H)
    label_w, char_w = 1.75, 0.118
    widths = [max(len(r["piece"]), len(r["bytes"]), sum(max(len(t), len(str(i))) for t, i in zip(r["tokens"], r["ids"])) + len(r["tokens"]) - 1)
              * char_w + 0.22 for r in rows]
    scale = min(1.0, (W - label_w - 0.15) / (sum(widths) + 0.06 * len(widths)))
    bands = [("pre-tokens", 0.25), ("UTF-8 bytes", 1.05), ("tokens", 1.85), ("ids", 2.65)]
    for text, y in bands:
        ax.text(0.1, y + 0.3, text, va="center", fontsize=MIN_PT, weight="bold")
    x = label_w
    for k, (r, w) in enumerate(zip(rows, widths)):
        w *= scale
        color = PIECE_COLORS[k % 2]
        for y, text in [(0.25, r["piece"].replace(" ", "␣").replace("\n", "⏎")), (1.05, r["bytes"])]:
            ax.add_patch(Rectangle((x, y), w, 0.6, facecolor=color, edgecolor="0.4", lw=1))
            ax.text(x + w / 2, y + 0.3, text, ha="center", va="center", fontsize=MIN_PT, family="monospace")
        tw = [max(len(t), len(str(i))) * char_w * scale + 0.08 for t, i in zip(r["tokens"], r["ids"])]
        tx = x + (w - sum(tw)) / 2
        for token, i, t_w in zip(r["tokens"], r["ids"], tw):
            ax.add_patch(Rectangle((tx, 1.85), t_w, 0.6, facecolor=NEW_COLOR, edgecolor="0.3", lw=1))
            ax.text(tx + t_w / 2, 2.15, token, ha="center", va="center", fontsize=MIN_PT, family="monospace")
            ax.text(tx + t_w / 2, 2.95, str(i), ha="center", va="center", fontsize=MIN_PT, family="monospace", color="tab:blue")
            tx += t_w
        x += w + 0.06
    return readable(fig)


def merge_steps(bpe, word):
    """apply_merges on `word` (a str in the byte alphabet) one merge at a time with GPT-2's ranks: [(symbols,
    the pair merged next, its rank)], the last with no pair. Runs `bpe.merge_pair` and the lowest-rank rule."""
    _, merges = load_gpt2_bpe()
    ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
    symbols, steps = tuple(word), []
    while True:
        ranked = [(ranks[p], p) for p in pairwise(symbols) if p in ranks]
        if not ranked:
            steps.append((symbols, None, None))
            break
        rank, pair = min(ranked)
        steps.append((symbols, pair, rank))
        symbols = tuple(bpe.merge_pair(symbols, pair))
    assert list(symbols) == list(bpe.apply_merges(word, ranks)), "merge_steps and apply_merges disagree"
    return steps


def plot_merge_steps(steps, figsize=(11.0, 4.9)):
    """One row per step: the symbols, the pair of lowest rank highlighted, and its rank."""
    W, H = figsize
    fig, ax = canvas(W, H)
    row_h = min(0.5, (H - 0.3) / len(steps))
    cell = min(0.62, (W - 3.6) / len(steps[0][0]))
    for r, (symbols, pair, rank) in enumerate(steps):
        y = 0.15 + r * row_h
        x = 0.2
        hit = next((i for i in range(len(symbols) - 1) if pair is not None and (symbols[i], symbols[i + 1]) == pair), None)
        for i, s in enumerate(symbols):
            w = cell * len(s) ** 0.75
            color = NEW_COLOR if hit is not None and i in (hit, hit + 1) else "white"
            ax.add_patch(Rectangle((x, y + 0.05), w, row_h - 0.1, facecolor=color, edgecolor="0.4", lw=1))
            ax.text(x + w / 2, y + row_h / 2, s, ha="center", va="center", fontsize=MIN_PT, family="monospace")
            x += w + 0.05
        note = f"merge {pair[0]} + {pair[1]}: rank {rank:,}" if pair else "no pair has a rank: done"
        ax.text(W - 0.15, y + row_h / 2, note, ha="right", va="center", fontsize=MIN_PT, family="monospace" if pair else None)
    return readable(fig)


# ----------------------------------------------------------------------------------------------
# 0c: what merges buy, and what the encoders cost

def compression(bpe, train_text, test_text, max_merges=1000, points=(0, 25, 50, 100, 200, 400, 700, 1000)):
    """Bytes per token of `test_text` with the first k merges that `bpe.train_byte_bpe` learns from `train_text`
    (merges are learned in order, so the first k of a long run are what a run of k would learn), and with
    GPT-2's own 50,000 merges (learned on WebText)."""
    merges = [tuple(m) for m in bpe.train_byte_bpe(train_text, 256 + max_merges)]
    size = len(test_text.encode("utf-8"))
    curve = {}
    for k in points:
        if k <= len(merges):
            curve[k] = size / len(bpe.ByteLevelBPE.from_merges(merges[:k]).encode_ordinary(test_text))
    gpt2 = size / len(bpe.ByteLevelBPE.gpt2().encode_ordinary(test_text))
    return {"train_chars": len(train_text), "test_bytes": size, "bytes_per_token": curve, "gpt2_bytes_per_token": gpt2,
            "first_merges": [" ".join(m) for m in merges[:12]]}


def plot_compression(data, figsize=(7.0, 4.6)):
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    ks = sorted(data["bytes_per_token"])
    ax.plot(ks, [data["bytes_per_token"][k] for k in ks], "o-", color="tab:blue", lw=2,
            label=f"merges learned on {data['train_chars'] // 1000}K chars of Shakespeare")
    ax.axhline(data["gpt2_bytes_per_token"], color="tab:red", ls="--", lw=2, label="GPT-2's 50,000 merges (WebText)")
    ax.set_xlabel("merges learned (vocabulary = 256 + merges)", fontsize=FONT)
    ax.set_ylabel("bytes per token, unseen text", fontsize=FONT)
    ax.set_ylim(0, max(data["gpt2_bytes_per_token"], max(data["bytes_per_token"].values())) * 1.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=MIN_PT, loc="lower right")
    ax.set_title("Each merge shortens the text; the first ones most", fontsize=TITLE_PT)
    return readable(fig)


def plot_throughput(record, figsize=(10.5, 3.9)):
    """Encoding speed of each encoder of results/tokenizer.json (MB/s, median round), as horizontal bars."""
    encoding = record["data"]["encoding"]
    labels = [label for label in ENCODERS if label in encoding]
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    speeds = [encoding[label]["mb_per_s"] for label in labels]
    colors = ["tab:blue" if label.startswith("reference") else "tab:gray" for label in labels]
    ax.barh(range(len(labels)), speeds, color=colors)
    for i, v in enumerate(speeds):
        ax.text(v, i, f" {v:.2f} MB/s", va="center", fontsize=MIN_PT)
    ax.set_yticks(range(len(labels)), [ENCODERS[label].replace(" (", "\n(", 1) for label in labels], fontsize=MIN_PT)
    ax.invert_yaxis()
    ax.set_xlim(0, max(speeds) * 1.3)
    ax.set_xlabel(f"MB/s encoding {record['data']['text']['bytes'] // 1000} KB of held-out Shakespeare, one thread", fontsize=FONT)
    ax.grid(axis="x", alpha=0.3)
    return readable(fig)
