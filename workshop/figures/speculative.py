"""Speculative decoding (module 7), measured and drawn: shared by bench/speculative.py,
notebooks/07_speculative.ipynb and the slides' figures (scripts/make_figures.py, slides/figures/07_*.png).

The three numbers that decide whether speculation pays (Leviathan et al. 2023):
- c, the cost ratio: one draft decode step / one target decode step (batch 1, KV cache);
- alpha: the chance that a draft token is accepted when the drafts before it were, i.e. accepted drafts /
  positions verified (greedy: the draft's token equals the target's). Not the acceptance rate, accepted
  drafts / drafted tokens (exercise 7's SpeculativeStats, vLLM, docs/benchmarks.md), which also counts
  the drafts after a round's first rejection, never judged: lower for k > 1, equal at k = 1;
- v(k), what verifying k + 1 tokens in one target forward costs, in target steps (1 on a GPU that is
  bound by reading weights; more on a CPU that is partly bound by arithmetic).
A round costs k draft steps and one verification and yields (1 - alpha^(k+1)) / (1 - alpha) tokens
on average, so the expected speed-up over plain decoding is

    (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))        (the paper's, with v = 1)

and the same with k c + v(k) below the line when the verification costs more than a step.
"""

import json
import statistics
import time

import matplotlib.pyplot as plt
import torch

import gpt
from workshop.figures.generation import FONT, readable
from workshop.grading.harness import paired_timing

ACCEPTED, CORRECTED, BONUS, REJECTED = "#2ca02c", "#1f77b4", "#9467bd", "#d62728"


def frequent_tokens(model_name, n):
    """The n tokens most frequent in a model's training text (models/<name>/token_frequencies.json,
    written by scripts/train.py), for a shortlisted draft."""
    path = gpt.MODELS_DIR / model_name / "token_frequencies.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: train the draft with scripts/train.py (which writes it) or pass --shortlist 0.")
    return json.loads(path.read_text())["ids"][:n]


def expected_tokens_per_round(alpha, k):
    """Tokens a round yields on average when each draft token is accepted with probability alpha."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha, c, k, verify_cost=1.0):
    """Leviathan et al.'s expected speed-up over plain decoding (verify_cost=1), or with a measured
    verification cost in target steps."""
    return expected_tokens_per_round(alpha, k) / (k * c + verify_cost)


def verified_positions(rounds):
    """Draft positions the target judged in traced rounds: a round that accepted m of its d drafts judged
    m that passed and, when m < d, one that failed. alpha = accepted / verified."""
    return sum(len(r["emitted"]) - 1 + (len(r["emitted"]) - 1 < len(r["drafted"])) for r in rounds)


class _Stepper:
    """A model with a KV cache of context_len positions, timing forwards of n new tokens after them."""

    def __init__(self, model, context_len):
        from solutions.ex2_kv_cache import KVCache

        self.model, self.context_len, self.cache = model, context_len, KVCache(model.config.n_layer)
        self.forward(context_len)

    @torch.no_grad()
    def forward(self, tokens):
        from solutions.ex2_kv_cache import forward
        from solutions.ex7_speculative import rollback

        device, start = self.model.device, len(self.cache)
        ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
        positions = torch.arange(start, start + tokens, device=device)[None]
        begin = time.perf_counter()
        forward(self.model, ids, positions, self.cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
        rollback(self.cache, self.context_len)
        return seconds


def step_seconds(model, context_len=64, tokens=1, steps=200, warmup=10):
    """Median seconds of one forward of `tokens` new tokens after context_len cached ones (batch 1),
    the model alone (so its weights stay in the CPU's caches between steps)."""
    stepper = _Stepper(model, context_len)
    return statistics.median([stepper.forward(tokens) for _ in range(warmup + steps)][warmup:])


def measure_costs(target, draft, ks, context_len=64, rounds=100, warmup=5):
    """c (a draft step / a target step) and v(k) (a verification of k + 1 tokens / a target step), timed
    as rounds run them: draft steps, a verification, a target step, one after the other, so that each
    model finds the CPU's caches as the other left them (measured alone, a small draft keeps its
    weights in cache and looks cheaper than it is). Medians over `rounds`."""
    t, d = _Stepper(target, context_len), _Stepper(draft, context_len)
    target_s, draft_s, verify_s = [], [], {k: [] for k in ks}
    for i in range(warmup + rounds):
        for k in ks or [1]:
            drafted = [d.forward(1) for _ in range(k)]
            verified = t.forward(k + 1)
            step = t.forward(1)
            if i >= warmup:
                draft_s += drafted
                target_s.append(step)
                if k in verify_s:
                    verify_s[k].append(verified)
    one = statistics.median(target_s)
    return statistics.median(draft_s) / one, {k: statistics.median(v) / one for k, v in verify_s.items()}


def sweep(spec, plain_generate, target, draft, prompts, max_new_tokens, ks, repeats=3):
    """For each k: alpha and tokens per target forward over the prompts' traced rounds, whether the
    outputs equal plain greedy decoding, and the wall-clock speed-up over it (median of `repeats`
    paired rounds that alternate which runs first). Greedy, EOS ignored. Also Jacobi decoding (the
    target alone) with a window of k guesses: its tokens per forward."""
    expected = [plain_generate(target, p, max_new_tokens, eos_token_id=-1) for p in prompts]
    rows = {}
    for k in ks:
        rounds, identical = [], True
        for prompt, plain in zip(prompts, expected):
            traced = traced_rounds(spec, target, draft, prompt, max_new_tokens, k)
            identical &= [t for r in traced for t in r["emitted"]] == plain
            rounds += traced
        jacobi = [spec.jacobi_generate(target, p, max_new_tokens, n=k, eos_token_id=-1)[1] for p in prompts]
        timing = paired_timing(lambda: [plain_generate(target, p, max_new_tokens, eos_token_id=-1) for p in prompts],
                               lambda k=k: [spec.speculative_generate(target, draft, p, max_new_tokens, k=k, eos_token_id=-1) for p in prompts],
                               repeats=repeats, device=target.device)
        generated = sum(len(r["emitted"]) for r in rounds)
        verified = verified_positions(rounds)
        rows[k] = {"alpha": (generated - len(rounds)) / verified if verified else 0.0, "verified": verified,
                   "rounds": len(rounds), "generated": generated,
                   "drafted": sum(len(r["drafted"]) for r in rounds), "accepted": generated - len(rounds),
                   "acceptance_rate": (generated - len(rounds)) / max(1, sum(len(r["drafted"]) for r in rounds)),
                   "tokens_per_target_forward": generated / len(rounds), "speedup": timing.ratio,
                   "speedups": timing.ratios, "outputs_identical": identical,
                   "jacobi_tokens_per_forward": sum(j.generated for j in jacobi) / sum(j.target_forwards for j in jacobi)}
    return rows


def traced_rounds(spec, target, draft, prompt, max_new_tokens, k):
    """One greedy run, round by round: for each round the drafted tokens and what came out, so the
    accepted / rejected / corrected / bonus tokens can be drawn."""
    class Recorder:
        def __init__(self):
            self.inner, self.proposals = spec.DraftModel(draft), []

        @property
        def forwards(self):
            return self.inner.forwards

        def propose(self, context, k, sampling, generator=None):
            tokens, probs = self.inner.propose(context, k, sampling, generator)
            self.proposals.append(tokens)
            return tokens, probs

    recorder = Recorder()
    decoder = spec.SpeculativeDecoder(target, recorder, prompt, k=k, eos_token_id=-1)
    rounds, produced = [], 0
    while produced < max_new_tokens:
        before = len(recorder.proposals)
        emitted = decoder.step(max_new_tokens - produced)
        drafted = recorder.proposals[-1] if len(recorder.proposals) > before else []
        rounds.append({"drafted": drafted, "emitted": emitted})
        produced += len(emitted)
    return rounds


def plot_rounds(rounds, tokenizer, prompt_text, k, max_rounds=7, width_in=9.0):
    """The course's picture: each round on a line, the draft's tokens in green (accepted) or red
    (rejected, struck through), the target's own token in blue (a correction) or purple (the bonus)."""
    shown = rounds[:max_rounds]
    fig, ax = plt.subplots(figsize=(width_in, 0.62 * len(shown) + 1.6))
    ax.set_axis_off()
    renderer = fig.canvas.get_renderer()
    y = len(shown)
    for i, r in enumerate(shown):
        accepted = len(r["emitted"]) - 1
        pieces = [(tokenizer.decode([t]), ACCEPTED, False) for t in r["drafted"][:accepted]]
        pieces += [(tokenizer.decode([t]), REJECTED, True) for t in r["drafted"][accepted:]]
        pieces.append((tokenizer.decode([r["emitted"][-1]]), BONUS if accepted == len(r["drafted"]) else CORRECTED, False))
        x = 0.0
        ax.text(x, y - i, f"round {i + 1}", fontsize=FONT, va="center", ha="left", color="0.3", transform=ax.transData)
        x = 0.16
        for text, color, struck in pieces:
            label = text.replace("\n", "\u21b5") or " "  # a newline token drawn as a return arrow
            t = ax.text(x, y - i, label, fontsize=FONT + 1, va="center", ha="left", color="white", family="monospace",
                        bbox={"boxstyle": "round,pad=0.25", "fc": color, "ec": "none", "alpha": 0.55 if struck else 1.0})
            box = t.get_window_extent(renderer=renderer).transformed(ax.transData.inverted())
            if struck:  # a rejected draft token is struck through
                ax.plot([box.x0, box.x1], [y - i, y - i], color="black", lw=1.5)
            x = box.x1 + 0.012
    ax.set_xlim(0, 1)
    ax.set_ylim(0.4, y + 0.6)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c) for c in (ACCEPTED, REJECTED, CORRECTED, BONUS)]
    ax.legend(handles, ["draft token accepted", "draft token rejected", "target's token (correction)", "target's bonus token"],
              ncol=2, fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, 0.0), frameon=False)
    ax.set_title(f"greedy speculative decoding, k = {k}, after {prompt_text!r}", fontsize=FONT)
    fig.tight_layout()
    return readable(fig)


def plot_speedup(record, width_in=11.5, height_in=4.3):
    """Measured speed-up over plain decoding against k, next to the expectation from alpha and c (the
    paper's, verification = 1 step) and with the measured verification cost; and tokens per target forward."""
    data = record["data"]
    ks = sorted(int(k) for k in data["k"])
    rows = [data["k"][str(k)] for k in ks]
    alpha, c = data["alpha"], data["c"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(width_in, height_in))
    left.plot(ks, [r["speedup"] for r in rows], "o-", color="black", lw=2, label="measured")
    left.plot(ks, [expected_speedup(alpha, c, k) for k in ks], "--", color=CORRECTED, label="expected, verify = 1 step")
    left.plot(ks, [expected_speedup(alpha, c, k, data["verify_cost"][str(k)]) for k in ks], ":", color=BONUS, lw=2,
              label="expected, measured verify cost")
    left.axhline(1, color="0.6", lw=1)
    left.set_xlabel("k (draft tokens per round)", fontsize=FONT)
    left.set_ylabel("speed-up over plain decoding", fontsize=FONT)
    left.set_title(f"alpha = {alpha:.2f}, c = {c:.2f}", fontsize=FONT)
    left.legend(fontsize=FONT - 1, frameon=False)
    right.plot(ks, [r["tokens_per_target_forward"] for r in rows], "o-", color="black", lw=2, label="measured")
    right.plot(ks, [expected_tokens_per_round(alpha, k) for k in ks], "--", color=CORRECTED, label="(1 - a^(k+1)) / (1 - a)")
    right.plot(ks, [k + 1 for k in ks], color="0.7", lw=1, label="k + 1 (a draft that always agrees)")
    right.set_xlabel("k", fontsize=FONT)
    right.set_ylabel("tokens per target forward", fontsize=FONT)
    right.legend(fontsize=FONT - 1, frameon=False)
    for ax in (left, right):
        ax.set_xticks(ks)
        ax.tick_params(labelsize=FONT)
    fig.suptitle(f"{data['target']} / {data['draft']}, batch 1, greedy, {record['meta']['machine']}", fontsize=FONT)
    fig.tight_layout()
    return readable(fig)


def rejection_sampling_draws(accept_sampled, p, q, draws=20_000, seed=0):
    """Emit one token `draws` times with k = 1 (a draft token drawn from q, judged against p): the
    emitted tokens' frequencies and the share of draft tokens accepted."""
    drafts = torch.multinomial(q, draws, replacement=True, generator=torch.Generator().manual_seed(seed)).tolist()
    generator = torch.Generator().manual_seed(seed + 1)
    out = [accept_sampled([d], q[None], torch.stack([p, p]), generator) for d in drafts]
    counts = torch.bincount(torch.tensor([o[0] for o in out]), minlength=len(p)).double()
    return counts / draws, sum(len(o) == 2 for o in out) / draws


def plot_rejection_sampling(p, q, emitted, accepted_share, width_in=11.5, height_in=4.0):
    """Left: the target's p, the draft's q, their overlap min(p, q) (what acceptance keeps) and the
    residual max(p - q, 0) (what a rejection draws from). Right: the emitted tokens' frequencies against p."""
    x = torch.arange(len(p))
    overlap, residual = torch.minimum(p, q), (p - q).clamp(min=0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(width_in, height_in))
    left.bar(x - 0.2, overlap, width=0.4, color=ACCEPTED, label=f"min(p, q): kept (sum {overlap.sum():.2f})")
    left.bar(x - 0.2, residual, bottom=overlap, width=0.4, color=BONUS, label="+ max(p - q, 0): after a rejection")
    left.bar(x + 0.2, q, width=0.4, color="0.65", label="draft q")
    left.set_title("the target's p (left bar), split in two", fontsize=FONT)
    left.set_xlabel("token", fontsize=FONT)
    left.set_ylabel("probability", fontsize=FONT)
    left.legend(fontsize=FONT - 1, frameon=False, loc="upper right")
    left.set_ylim(0, float(max(p.max(), q.max())) * 1.7)
    right.bar(x - 0.2, p, width=0.4, color=CORRECTED, label="target p")
    right.bar(x + 0.2, emitted, width=0.4, color="black", label="emitted, measured")
    right.set_xlabel("token", fontsize=FONT)
    right.set_title(f"drafts accepted: {accepted_share:.1%} (sum of min(p, q): {overlap.sum():.1%})", fontsize=FONT)
    right.legend(fontsize=FONT - 1, frameon=False, loc="upper right")
    right.set_ylim(0, float(p.max()) * 1.5)
    for ax in (left, right):
        ax.set_xticks(x.tolist())
        ax.tick_params(labelsize=FONT)
    fig.tight_layout()
    return readable(fig)
