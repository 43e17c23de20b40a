"""The paged KV cache (module 5), measured and drawn: shared by notebooks/05_paged_kv_cache.ipynb and
the slides' figures (scripts/make_figures.py draws slides/figures/05_*.png with these same functions).

Every picture is a real run of exercise 5's code (whichever implementation the caller passes in:
`paged` is the module, e.g. workshop.grading.harness.implementation("ex5_paged_kv_cache")): its
BlockAllocator and BlockTable for the worked example, its Engine's own per-step counters for the
memory, the chunked prefill and the preemptions, its block tables and reference counts for sharing.
Exercise 4's memory on the same workload is watched from outside, without changing it
(workshop.serving.runs.continuous_kv_memory).
"""

import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from workshop.serving import runs as serving
from workshop.figures.generation import FONT, MIN_PT, canvas, readable

NO_EOS = serving.NO_EOS
SEQ_COLOR, OTHER_COLOR, NEW_COLOR, FREE_COLOR = "#7fb2e5", "0.82", "#1f4e99", "white"
PREFILL_COLOR, DECODE_COLOR, RECOMPUTE_COLOR = "#7fb2e5", "#1f4e99", "tab:red"


# ----------------------------------------------------------------------------------------------
# KV memory per token: the formula

def kv_bytes_per_token(config, bytes_per_value=2):
    """Bytes of KV cache per token: keys and values (2) x layers x heads x head_dim x bytes per value."""
    return 2 * config.n_layer * config.n_head * (config.n_embd // config.n_head) * bytes_per_value


def kv_size(config):
    """The formula's terms and results for one model config (a gpt.GPTConfig)."""
    return {"n_layer": config.n_layer, "n_head": config.n_head, "head_dim": config.n_embd // config.n_head,
            "n_positions": config.n_positions,
            "bytes_per_token_16bit": kv_bytes_per_token(config, 2), "bytes_per_token_32bit": kv_bytes_per_token(config, 4),
            "context_bytes_16bit": kv_bytes_per_token(config, 2) * config.n_positions}


# ----------------------------------------------------------------------------------------------
# The worked example: one sequence's block table filling up, in a pool another request shares

def block_table_example(paged, tokenizer, prompt, words, other_prompt, other_tokens, block_size=4, num_blocks=8):
    """Run exercise 5's BlockAllocator and BlockTable on the course's example: request A's prompt, then
    its completion `words` appended one at a time (each word as the tokenizer splits it), while another
    request B, admitted first, shares the pool and decodes one token per step as well (its prompt
    `other_prompt`, its tokens `other_tokens`, ids). Returns {"block_size", "num_blocks", "words",
    "tokens_per_word", "snapshots"}: a snapshot after the prompts and after each word,
    {"label", "ref_counts", "tables": {"A" or "B": {"blocks", "num_tokens", "texts", "slots"}}}."""
    allocator = paged.BlockAllocator(num_blocks, block_size)
    texts = {"A": [tokenizer.decode([t]) for t in tokenizer.encode(prompt)],
             "B": [tokenizer.decode([t]) for t in tokenizer.encode(other_prompt)]}
    tables = {"B": paged.BlockTable(block_size), "A": paged.BlockTable(block_size)}
    pieces = [[tokenizer.decode([t]) for t in tokenizer.encode(w)] for w in words]
    other = [tokenizer.decode([t]) for t in other_tokens]

    def snapshot(label):
        return {"label": label, "ref_counts": list(allocator.ref_counts),
                "tables": {name: {"blocks": list(t.blocks), "num_tokens": t.num_tokens, "texts": texts[name][:t.num_tokens],
                                  "slots": t.slot_mapping(0, t.num_tokens)} for name, t in tables.items()}}

    for name in ("B", "A"):  # B was admitted first
        tables[name].append(len(texts[name]), allocator)
    snapshots = [snapshot("the prompt")]
    for i, (word, piece) in enumerate(zip(words, pieces)):
        if i < len(other):  # B decodes its token of this step first (it was admitted first), then A
            texts["B"].append(other[i])
            tables["B"].append(1, allocator)
        texts["A"] += piece
        tables["A"].append(len(piece), allocator)
        snapshots.append(snapshot(f"+ {word.strip()}"))
    return {"block_size": block_size, "num_blocks": num_blocks, "words": [w.strip() for w in words],
            "tokens_per_word": [len(p) for p in pieces], "snapshots": snapshots}


def _word(text):
    return text.replace("\n", "\\n").strip() or "␣"



def plot_block_table(example, snapshot=-1, figsize=(11.5, 5.1)):
    """As the vLLM talk draws it: request A's logical blocks (its tokens in their slots, top to bottom),
    its block table (logical -> physical block, slots filled), and the physical pool below, where A's
    blocks lie wherever the allocator found room between those of request B. One snapshot (default: the last)."""
    snap = example["snapshots"][snapshot]
    bs, n = example["block_size"], example["num_blocks"]
    a, b = snap["tables"]["A"], snap["tables"]["B"]
    W, H = figsize
    fig, ax = canvas(W, H)
    cell, slot = 1.38, 0.36  # a block is a column of block_size slots, as wide as the longest word at 12 pt
    pool_x = (W - n * cell) / 2
    ax.text(0.1, 0.25, "request A: logical blocks", fontsize=FONT, weight="bold", va="center")
    top = 0.75

    def column(x, y, texts, colors, text_color="black"):
        for j in range(bs):
            ax.add_patch(Rectangle((x, y + j * slot), cell, slot, facecolor=colors[j], edgecolor="0.3", lw=1))
            if texts[j]:
                ax.text(x + cell / 2, y + (j + 0.5) * slot, texts[j], ha="center", va="center", fontsize=MIN_PT, color=text_color)

    pool_y = top + bs * slot + 1.0
    for i, block in enumerate(a["blocks"]):
        x = 0.1 + i * (cell + 0.15)
        texts = [_word(a["texts"][i * bs + j]) if i * bs + j < a["num_tokens"] else "" for j in range(bs)]
        ax.text(x + cell / 2, top - 0.17, f"block {i}", ha="center", va="center", fontsize=MIN_PT)
        column(x, top, texts, [SEQ_COLOR if t else FREE_COLOR for t in texts])
        ax.add_artist(FancyArrowPatch((x + cell / 2, top + bs * slot + 0.05), (pool_x + (block + 0.5) * cell, pool_y - 0.33),
                                      arrowstyle="-|>", mutation_scale=14, color="tab:blue", lw=1.5))
    tx = 0.1 + 3 * (cell + 0.15) + 0.9
    ax.text(tx, 0.25, "request A: block table", fontsize=FONT, weight="bold", va="center")
    cols = [("logical block", 1.55), ("physical block", 1.6), ("slots filled", 1.4)]
    for r in range(len(a["blocks"]) + 1):
        x = tx
        for c, (name, w) in enumerate(cols):
            y = top - 0.3 + r * slot
            if r == 0:
                text = name
            else:
                i = r - 1
                text = [str(i), str(a["blocks"][i]), f"{min(bs, a['num_tokens'] - i * bs)} of {bs}"][c]
            ax.add_patch(Rectangle((x, y), w, slot, facecolor="0.93" if r == 0 else "white", edgecolor="0.3", lw=1))
            ax.text(x + w / 2, y + slot / 2, text, ha="center", va="center", fontsize=MIN_PT,
                    weight="bold" if r == 0 or c == 1 else "normal")
            x += w
    ax.text(tx, top - 0.3 + (len(a["blocks"]) + 1) * slot + 0.3,
            f"request B, admitted first, holds blocks {', '.join(map(str, b['blocks']))}", fontsize=MIN_PT, va="center", color="0.3")
    ax.text(pool_x, pool_y + bs * slot + 0.3, "physical KV blocks: the pool (blue: request A, grey: request B, white: free)",
            fontsize=FONT, weight="bold", va="center")
    owner = {blk: ("A", i) for i, blk in enumerate(a["blocks"])} | {blk: ("B", i) for i, blk in enumerate(b["blocks"])}
    for k in range(n):
        x = pool_x + k * cell
        texts, colors = [""] * bs, [FREE_COLOR] * bs
        who = owner.get(k)
        if who:
            t = snap["tables"][who[0]]
            for j in range(bs):
                p = who[1] * bs + j
                if p < t["num_tokens"]:
                    texts[j], colors[j] = _word(t["texts"][p]), SEQ_COLOR if who[0] == "A" else OTHER_COLOR
        column(x, pool_y, texts, colors, "black" if who and who[0] == "A" else "0.3")
        ax.text(x + cell / 2, pool_y - 0.17, f"block {k}", ha="center", va="center", fontsize=MIN_PT,
                weight="bold" if who and who[0] == "A" else "normal")
    readable(fig)
    return fig


def plot_block_table_steps(example, figsize=(11.5, 4.4)):
    """Request A's block table after its prompt and after each appended token: each logical block as its
    block_size slots (coloured: holding a token; dark: the token just appended), each slot labelled with
    its pool slot (physical block x block_size + offset), the physical block above. A new block comes
    exactly when the last one is full."""
    bs = example["block_size"]
    snaps = example["snapshots"]
    most = max(len(s["tables"]["A"]["blocks"]) for s in snaps)
    W, H = figsize
    fig, ax = canvas(W, H)
    cell, label_w, gap = 0.46, 2.85, 0.3
    row_h = (H - 0.2) / len(snaps)
    before = 0
    for r, snap in enumerate(snaps):
        a = snap["tables"]["A"]
        y = 0.15 + r * row_h
        n = a["num_tokens"]
        ax.text(0.1, y + 0.45 * row_h, snap["label"], fontsize=FONT, weight="bold", va="center")
        ax.text(0.1, y + 0.78 * row_h, f"{n} tokens: ⌈{n}/{bs}⌉ = {-(-n // bs)} blocks", fontsize=MIN_PT, va="center", color="0.3")
        for i, block in enumerate(a["blocks"]):
            x0 = label_w + i * (bs * cell + gap)
            new_block = r > 0 and i >= len(snaps[r - 1]["tables"]["A"]["blocks"])
            ax.text(x0 + bs * cell / 2, y + 0.2 * row_h, f"block {i} → {block}", ha="center", va="center", fontsize=MIN_PT,
                    weight="bold" if new_block else "normal", color="tab:red" if new_block else "black")
            for j in range(bs):
                p = i * bs + j
                color = FREE_COLOR if p >= n else NEW_COLOR if p >= before and r > 0 else SEQ_COLOR
                ax.add_patch(Rectangle((x0 + j * cell, y + 0.38 * row_h), cell, 0.45 * row_h, facecolor=color, edgecolor="0.3", lw=1))
                ax.text(x0 + (j + 0.5) * cell, y + 0.605 * row_h, str(block * bs + j), ha="center", va="center", fontsize=MIN_PT,
                        color="white" if color == NEW_COLOR else "black" if p < n else "0.55")
        rest = n % bs
        note = "full: no new block yet" if rest == 0 else "a new block" if rest == 1 and r > 0 else f"room for {bs - rest} more"
        ax.text(label_w + most * (bs * cell + gap) + 0.05, y + 0.605 * row_h, note, fontsize=MIN_PT, va="center",
                color="tab:red" if note == "a new block" else "black")
        before = n
    readable(fig)
    return fig


# ----------------------------------------------------------------------------------------------
# KV memory over a run: contiguous reservation, exercise 4's left-padded batch, the paged pool

def kv_memory(continuous, paged, model, workload, max_batch_size, block_size=16):
    """Serve `workload` with exercise 4's engine (watched from outside) and exercise 5's (its own
    counters), both with no EOS, and return the slots each scheme holds at each step and the tokens in
    them: {"context", "reservation", "batch", "paged": serving.KVMemory, "steps", "context_slots"}.
    "context" reserves the model's whole context for every running request, "reservation" its
    prompt + max_new_tokens, "batch" is exercise 4's left-padded cache, "paged" exercise 5's blocks in use.
    The two engines schedule alike here (no token budget binds, the pool is large), so every scheme holds
    the same tokens at every step: checked."""
    watched = serving.continuous_kv_memory(continuous, model, workload, max_batch_size)
    if watched is None:
        raise ValueError("exercise 4's engine has no left-padded running batch to watch: pass the reference solution.")
    batch, reservation = watched
    result = serving.run_paged(paged, model, workload, max_batch_size, block_size=block_size).result
    pool = serving.paged_kv_memory(result)
    if pool.tokens != batch.tokens:
        raise RuntimeError("the paged engine held other tokens than exercise 4's at some step: the schedules differ, "
                           "so the memory of the two cannot be compared step by step.")
    context = model.config.n_positions
    whole = serving.KVMemory([rows * context for rows in result.stats.batch_sizes], list(pool.tokens))
    return {"context": whole, "reservation": reservation, "batch": batch, "paged": pool, "steps": result.stats.steps,
            "context_slots": context, "block_size": block_size, "result": result}


MEMORY_COLORS = {"context": "0.55", "reservation": "tab:orange", "batch": "tab:purple", "paged": "tab:blue"}


def plot_kv_memory(memory, figsize=(11.5, 4.4)):
    """Left: slots held at every step by each scheme, and the tokens in them. Right: the slots held on
    average per step, split into those holding a token (solid) and those reserved but empty (hatched),
    with the share used."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.2, 1]})
    bs = memory["block_size"]
    steps = range(memory["steps"])
    short = {"reservation": "reserve prompt + max_new", "batch": "exercise 4's padded batch", "paged": f"paged, blocks of {bs}"}
    for key in ("reservation", "batch", "paged"):
        ax1.plot(steps, memory[key].slots, color=MEMORY_COLORS[key], lw=1.5, label=short[key])
    ax1.fill_between(steps, memory["paged"].tokens, color="0.8", lw=0, label="tokens held")
    top = max(max(memory[k].slots) for k in ("reservation", "batch", "paged"))
    ax1.set(xlabel="engine step", ylabel="KV slots (per layer)", xlim=(0, memory["steps"]), ylim=(0, top * 1.6))
    ax1.legend(fontsize=MIN_PT, loc="upper right", handlelength=1.5)
    ax1.grid(alpha=0.3)
    keys = ["context", "reservation", "batch", "paged"]
    labels = {"context": "reserve the\nwhole context", "reservation": "reserve prompt\n+ max_new_tokens",
              "batch": "exercise 4:\npadded batch", "paged": f"exercise 5:\npaged, blocks of {bs}"}
    used = [statistics.mean(memory[k].tokens) for k in keys]
    held = [statistics.mean(memory[k].slots) for k in keys]
    y = range(len(keys))
    ax2.barh(y, used, color=[MEMORY_COLORS[k] for k in keys])
    ax2.barh(y, [h - u for h, u in zip(held, used)], left=used, color=[MEMORY_COLORS[k] for k in keys], alpha=0.25,
             hatch="//", edgecolor="white")
    for i, k in enumerate(keys):
        ax2.text(held[i] + 0.02 * max(held), i, f"{memory[k].utilization:.0%} used", va="center", fontsize=MIN_PT)
    ax2.set_yticks(list(y), [labels[k] for k in keys])
    ax2.invert_yaxis()
    ax2.set_xlim(0, max(held) * 1.35)
    ax2.set_xlabel("KV slots, mean per step")
    ax2.grid(alpha=0.3, axis="x")
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# The engine at work: the token budget, chunked prefill, preemption

def engine_steps(paged, model, workload, max_batch_size, **engine_options):
    """Serve `workload` with exercise 5's Engine, watching each step's schedule from outside: how many
    tokens of each kind the step computes (prompt, decode, or recomputed after a preemption), the
    blocks in use (the engine's counter) and the steps that preempted someone.
    Returns {"prefill", "decode", "recompute": [tokens per step], "blocks": [...], "preempted_at": [steps],
    "prompt_steps": {sequence id: steps its prompt took, chunks}, "result": EngineResult}."""
    engine = paged.Engine(model, max_batch_size, eos_token_id=NO_EOS, **engine_options)
    record = {"prefill": [], "decode": [], "recompute": [], "preempted_at": [], "prompt_steps": {}}
    computed_before = {}  # sequence -> the most of its tokens ever computed: below that, computing is recomputing
    schedule, preempt = engine.schedule, engine.preempt

    def watched_schedule():
        scheduled = schedule()
        kinds = {"prefill": 0, "decode": 0, "recompute": 0}
        for seq, n in scheduled:
            start, prompt = seq.num_computed, len(seq.request.prompt_ids)  # step() moves num_computed after the forward
            for p in range(start, start + n):
                kind = "recompute" if p < computed_before.get(seq.id, 0) else "prefill" if p < prompt else "decode"
                kinds[kind] += 1
            if start < prompt and start >= computed_before.get(seq.id, 0):  # a piece of its prompt, for the first time
                record["prompt_steps"][seq.id] = record["prompt_steps"].get(seq.id, 0) + 1
            computed_before[seq.id] = max(computed_before.get(seq.id, 0), start + n)
        if scheduled:
            for kind, count in kinds.items():
                record[kind].append(count)
        return scheduled

    def watched_preempt(seq):
        record["preempted_at"].append(engine.step_index)
        return preempt(seq)

    engine.schedule, engine.preempt = watched_schedule, watched_preempt
    result = engine.run([paged.Request(p, n) for p, n in zip(workload.prompts, workload.max_new_tokens)])
    record["blocks"] = list(result.stats.blocks_in_use)
    record["result"] = result
    return record


def plot_engine_steps(steps, num_blocks, budget, figsize=(11.5, 4.6)):
    """Top: the tokens each step computes, stacked by kind, under the token budget. Bottom: the blocks
    in use against the pool, a red tick at each step that preempted a sequence."""
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=figsize, sharex=True)
    n = len(steps["decode"])
    x = range(n)
    bottom = [0] * n
    for kind, color in (("decode", DECODE_COLOR), ("prefill", PREFILL_COLOR), ("recompute", RECOMPUTE_COLOR)):
        ax1.bar(x, steps[kind], bottom=bottom, width=1.0, color=color, label=f"{kind}: {sum(steps[kind]):,} tokens", lw=0)
        bottom = [b + v for b, v in zip(bottom, steps[kind])]
    ax1.axhline(budget, color="0.3", ls="--", lw=1)
    ax1.text(n, budget, f" budget {budget}", va="center", fontsize=MIN_PT)
    ax1.set(ylabel="tokens per step", ylim=(0, budget * 1.25))
    ax1.legend(fontsize=MIN_PT, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 1.3), frameon=False)
    ax2.plot(x, steps["blocks"], color="tab:blue", lw=1.5)
    ax2.axhline(num_blocks, color="0.3", ls="--", lw=1)
    ax2.text(n, num_blocks, f" pool {num_blocks}", va="center", fontsize=MIN_PT)
    for s in sorted(set(steps["preempted_at"])):
        ax2.axvline(s, color="tab:red", lw=1, alpha=0.7)
    ax2.set(ylabel="blocks in use", xlabel=f"engine step (red: a preemption, {len(steps['preempted_at'])} in all)",
            ylim=(0, num_blocks * 1.15), xlim=(-0.5, n - 0.5))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Sharing: copy-on-write for parallel sampling, and prefix caching

def sharing_example(paged, model, requests, block_size=4, num_blocks=8, steps=3):
    """Run exercise 5's Engine (prefix caching on) on `requests` and record, after each of the first
    `steps` steps, every running sequence's block table and the pool's reference counts.
    Returns [{"step", "tables": {label: [blocks]}, "tokens": {label: num_tokens}, "ref_counts", "copies",
    "prefix_hit_tokens"}]."""
    engine = paged.Engine(model, max_batch_size=4, num_blocks=num_blocks, block_size=block_size,
                          max_num_batched_tokens=64, enable_prefix_caching=True, eos_token_id=NO_EOS)
    snapshots, step = [], engine.step

    def label(seq):  # request k, continuation i
        k = [id(r) for r in requests].index(id(seq.request))
        return f"R{k}" if seq.request.n == 1 else f"R{k}.{seq.index}"

    def watched():
        step()
        if len(snapshots) < steps:
            snapshots.append({"step": engine.step_index,
                              "tables": {label(s): list(s.block_table.blocks) for s in engine.running},
                              "tokens": {label(s): s.block_table.num_tokens for s in engine.running},
                              "ref_counts": list(engine.allocator.ref_counts), "copies": engine.stats.copies,
                              "prefix_hit_tokens": {label(s): s.prefix_hit_tokens for s in engine.running}})

    engine.step = watched
    result = engine.run(requests)
    return snapshots, result


def plot_sharing(snapshots, titles, block_size, num_blocks, figsize=(11.5, 4.4)):
    """One panel per snapshot: each running sequence's block table (its logical blocks, each with the
    slots it fills, coloured like the physical block it maps to) above the pool, an arrow from each to
    its physical block, and every block's reference count (red: shared)."""
    fig, axes = plt.subplots(1, len(snapshots), figsize=figsize)
    colors = plt.get_cmap("tab10").colors
    for ax, snap, title in zip(axes, snapshots, titles):
        box, pitch = 0.62, 0.75  # logical and physical blocks: one pitch per physical block of the pool
        pool_y, x = 2.6, 0.0
        for label in snap["tables"]:
            blocks, n = snap["tables"][label], snap["tokens"][label]
            ax.text(x + (len(blocks) * pitch - (pitch - box)) / 2, 0.25, label, ha="center", va="center", fontsize=MIN_PT, weight="bold")
            for i, block in enumerate(blocks):
                bx = x + i * pitch
                ax.add_patch(Rectangle((bx, 0.55), box, 0.62, facecolor=colors[block % 10], alpha=0.35, edgecolor="0.3"))
                ax.text(bx + box / 2, 0.86, f"{min(block_size, n - i * block_size)}/{block_size}", ha="center", va="center",
                        fontsize=MIN_PT)
                ax.add_artist(FancyArrowPatch((bx + box / 2, 1.2), (block * pitch + box / 2, pool_y - 0.05), arrowstyle="-|>",
                                              mutation_scale=10, color=colors[block % 10], lw=1.2))
            x += len(blocks) * pitch + 0.35
        for k in range(num_blocks):
            ref = snap["ref_counts"][k]
            ax.add_patch(Rectangle((k * pitch, pool_y), box, 0.62, facecolor=colors[k % 10] if ref else "white",
                                   alpha=0.35 if ref else 1, edgecolor="0.3"))
            ax.text(k * pitch + box / 2, pool_y + 0.31, str(k), ha="center", va="center", fontsize=MIN_PT)
            ax.text(k * pitch + box / 2, pool_y + 0.95, str(ref), ha="center", va="center", fontsize=MIN_PT,
                    weight="bold" if ref > 1 else "normal", color="tab:red" if ref > 1 else "0.3")
        ax.text(num_blocks * pitch - 0.1, pool_y + 0.31, " pool", ha="left", va="center", fontsize=MIN_PT)
        ax.text(num_blocks * pitch - 0.1, pool_y + 0.95, " refs", ha="left", va="center", fontsize=MIN_PT)
        ax.set_title(title, fontsize=FONT, loc="left")
        ax.set_xlim(-0.05, max(x, num_blocks * pitch) + 0.45)
        ax.set_ylim(pool_y + 1.25, 0)
        ax.axis("off")
    readable(fig)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Paged attention's gather: block tables -> gathered keys and values -> SDPA with a mask

def gather_example(paged, device="cpu"):
    """A real packed step of exercise 5's code, pool of 8 blocks of 4: sequence A (9 tokens cached) decodes
    its 10th; sequence B (2 tokens cached) computes a 3-token chunk. Their blocks are allocated in turns,
    so they interleave in the pool. Returns the tables, pack()'s padded tables and mask, and the lengths."""
    bs, allocator = 4, paged.BlockAllocator(8, block_size=4)
    a, b = paged.BlockTable(bs), paged.BlockTable(bs)
    for table, n in ((a, 4), (b, 2), (a, 4), (b, 3), (a, 2)):  # turns: A's and B's blocks interleave
        table.append(n, allocator)
    starts, chunks = [9, 2], [[0], [0, 0, 0]]  # A: position 9; B: positions 2-4 (token ids do not matter here)
    _, _, batch = paged.pack(chunks, starts, [list(a.blocks), list(b.blocks)], bs, device)
    return {"block_size": bs, "num_blocks": 8, "tables": {"A": list(a.blocks), "B": list(b.blocks)},
            "lengths": {"A": 10, "B": 5}, "starts": {"A": 9, "B": 2}, "chunks": {"A": 1, "B": 3},
            "padded_tables": batch.block_tables.tolist(), "mask": batch.mask[:, 0].tolist()}


def plot_gather(example, figsize=(11.5, 4.3)):
    """Three moves of paged attention: each sequence's block table picks its blocks out of the pool; the
    gathered blocks line up as one key/value row per sequence (the short table padded); the mask (key
    position <= query position) hides what is not the sequence's past, and one SDPA runs over all rows."""
    bs, n = example["block_size"], example["num_blocks"]
    tables, padded, mask = example["tables"], example["padded_tables"], example["mask"]
    colors = {"A": SEQ_COLOR, "B": "#f2b36b"}
    W, H = figsize
    fig, ax = canvas(W, H)
    cell, slot = 0.27, 0.30
    owner = {blk: (s, i) for s, t in tables.items() for i, blk in enumerate(t)}
    # 1. the pool
    ax.text(0.1, 0.3, "1. the pool (keys)", fontsize=FONT, weight="bold", va="center")
    px, py = 0.25, 0.85
    for k in range(n):
        y = py + k * (slot + 0.08)
        ax.text(px - 0.05, y + slot / 2, f"{k}", ha="right", va="center", fontsize=MIN_PT)
        who = owner.get(k)
        for j in range(bs):
            filled = who and who[1] * bs + j < example["lengths"][who[0]]
            ax.add_patch(Rectangle((px + j * cell, y), cell, slot, facecolor=colors[who[0]] if filled else FREE_COLOR,
                                   edgecolor="0.3", lw=1))
        if who:
            ax.text(px + bs * cell + 0.08, y + slot / 2, f"{who[0]}'s block {who[1]}", va="center", fontsize=MIN_PT)
    # 2. the block tables and the gathered rows
    gx = 3.15
    ax.text(gx, 0.3, "2. gather: pool[block_tables]", fontsize=FONT, weight="bold", va="center")
    for r, (name, row) in enumerate(zip(("A", "B"), padded)):
        y = 1.05 + r * 1.55
        ax.text(gx, y - 0.05, f"{name}'s table {row}" + ("  (padded with block 0)" if len(row) > len(tables[name]) else ""),
                fontsize=MIN_PT, va="bottom")
        for i, blk in enumerate(row):
            for j in range(bs):
                p = i * bs + j
                real = i < len(tables[name]) and p < example["lengths"][name]
                ax.add_patch(Rectangle((gx + p * cell, y + 0.08), cell, slot, facecolor=colors[name] if real else "0.93",
                                       edgecolor="0.3", lw=1, hatch=None if real else "//"))
            ax.text(gx + (i * bs + bs / 2) * cell, y + 0.08 + slot + 0.2, f"block {blk}", ha="center", va="center", fontsize=MIN_PT)
            src = py + blk * (slot + 0.08) + slot / 2
            if i < len(tables[name]):
                ax.add_artist(FancyArrowPatch((px + bs * cell + 1.3, src), (gx + i * bs * cell, y + 0.08 + slot / 2),
                                              arrowstyle="-|>", mutation_scale=10, color="0.45", lw=1, alpha=0.7))
    # 3. the mask and SDPA
    mx = 7.35
    ax.text(mx - 0.6, 0.3, "3. mask: key j \u2264 query position p", fontsize=FONT, weight="bold", va="center")
    y = 0.95
    for name, rows in zip(("A", "B"), mask):
        start, k = example["starts"][name], example["chunks"][name]
        for q in range(k):
            ax.text(mx - 0.05, y + slot / 2, f"{name} p={start + q}", ha="right", va="center", fontsize=MIN_PT)
            for j, visible in enumerate(rows[q]):
                ax.add_patch(Rectangle((mx + 0.55 + j * cell * 0.9, y), cell * 0.9, slot,
                                       facecolor=colors[name] if visible else "white", edgecolor="0.5", lw=0.8))
            y += slot + 0.05
        y += 0.3
    ax.text(mx - 0.6, y + 0.1, "then ONE call, SDPA(queries, keys, values,\nattn_mask=mask), for every sequence of the\n"
            "step; the valid queries go back to the\nN packed rows", fontsize=MIN_PT, va="top")
    readable(fig)
    return fig
