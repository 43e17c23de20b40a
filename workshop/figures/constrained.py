"""Constrained decoding (exercise 6, parts 6e and 6f) for notebook 06, deck 06 and bench/constrained.py:
a JSON-ish answer decoded under a regex, how many tokens the mask leaves at each step, and its plot.

    run = json_answer(model, tokenizer)          # WORKSHOP_IMPL picks whose ex6_constrained runs
    run.text, run.free_text                      # constrained, and the same prompt left alone
    plot_allowed_per_step(run)                   # bars: tokens allowed at each step (log scale)
"""

from dataclasses import dataclass

from workshop.grading.harness import implementation

JSON_PROMPT = "JULIET:\nWhat is thy name, and how old art thou?\nROMEO:\n"
JSON_REGEX = r'\{"name": "[A-Z][a-z]{1,9}", "age": [0-9]{1,2}, "mood": "(happy|sad|in love)"\}'


@dataclass
class ConstrainedRun:
    pattern: str
    prompt: str
    text: str  # the constrained answer (it fully matches pattern)
    pieces: list  # the text of each new token (EOS as "<EOS>")
    allowed: list  # per step: how many tokens the mask allowed (EOS included)
    vocab_size: int
    free_text: str  # what the same model writes after the same prompt, greedy, without a constraint


def json_answer(model, tokenizer, prompt=JSON_PROMPT, pattern=JSON_REGEX, sampling=None, impl=None, max_new_tokens=48):
    """Decode `prompt` under `pattern` with ex6_constrained's generate (greedy unless `sampling`, a
    SamplingParams, says otherwise), then replay the tokens to count the allowed ones at each step."""
    from solutions.ex2_kv_cache import generate as free_generate
    from workshop.serving.sampling import GREEDY

    module = implementation("ex6_constrained", impl)
    vocab = module.Vocabulary.from_tokenizer(tokenizer)
    constraint = module.RegexConstraint(pattern, vocab)
    prompt_ids = tokenizer.encode(prompt)
    tokens = module.generate(model, prompt_ids, constraint, max_new_tokens, sampling or GREEDY)
    state, allowed = constraint.start(), []
    for token in tokens:
        allowed.append(int(constraint.allowed(state).sum()))
        if token != vocab.eos_token_id:
            state = constraint.advance(state, token)
    pieces = ["<EOS>" if t == vocab.eos_token_id else tokenizer.decode([t]) for t in tokens]
    free = free_generate(model, prompt_ids, len(tokens), eos_token_id=-1)
    return ConstrainedRun(pattern, prompt, vocab.decode(tokens), pieces, allowed, vocab.size, tokenizer.decode(free))


def plot_allowed_per_step(run, ax=None):
    """One bar per generated token: how many of the vocabulary's tokens the mask allowed at that step,
    on a log scale (the whole vocabulary at the top, a single forced token at the bottom)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 4.2))
    steps = range(len(run.allowed))
    colors = ["#c44e52" if n == 1 else "#4c72b0" for n in run.allowed]
    ax.bar(steps, run.allowed, color=colors)
    ax.axhline(run.vocab_size, color="grey", linestyle="--", linewidth=1)
    ax.text(len(run.allowed) - 0.5, run.vocab_size * 1.15, f"whole vocabulary ({run.vocab_size:,})", ha="right", va="bottom", fontsize=12)
    ax.set_yscale("log")
    ax.set_ylim(0.8, run.vocab_size * 4)
    ax.set_xticks(list(steps))
    ax.set_xticklabels([repr(p)[1:-1] for p in run.pieces], rotation=60, ha="right", fontsize=12, family="monospace")
    ax.set_ylabel("tokens allowed", fontsize=12)
    ax.set_title(f"Each step's mask under {run.pattern}  (red: one token forced)", fontsize=12)
    ax.tick_params(axis="y", labelsize=12)
    ax.figure.tight_layout()
    return ax
