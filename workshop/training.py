"""Training a small GPT-2 on a text file (the engine behind scripts/train.py, which made models/).

The last 10% of the text is held out for validation; the checkpoint with the best validation loss is
kept, written in Hugging Face's format with a model card and training_log.json. Training state is
saved to OUT/train_state.pt every evaluation, so a run can resume.
"""

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import gpt


def batches(tokens, block_size, batch_size, generator):
    """Random windows of block_size + 1 tokens: inputs and next-token targets."""
    while True:
        starts = torch.randint(len(tokens) - block_size - 1, (batch_size,), generator=generator)
        chunk = torch.stack([tokens[s : s + block_size + 1] for s in starts.tolist()])
        yield chunk[:, :-1], chunk[:, 1:]


def loss_on(model, x, y, teacher=None):
    """Cross-entropy against the next tokens; with a teacher model, the KL divergence from the teacher's
    next-token distributions instead (distillation: the student learns to predict what the teacher
    would, which is what a speculative-decoding draft is for)."""
    positions = torch.arange(x.shape[1]).expand_as(x)
    logits = model(x, positions)
    if teacher is None:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())
    with torch.no_grad():
        target = F.log_softmax(teacher(x, positions).flatten(0, 1).float(), dim=-1)
    return F.kl_div(F.log_softmax(logits.flatten(0, 1), dim=-1), target, log_target=True, reduction="batchmean")


@torch.no_grad()
def validation_loss(model, tokens, block_size, max_windows=64):
    """Mean loss over evenly spaced, non-overlapping windows of the held-out text (deterministic)."""
    model.eval()
    n = min(max_windows, (len(tokens) - 1) // block_size)
    losses = [loss_on(model, tokens[i * block_size : (i + 1) * block_size][None],
                      tokens[i * block_size + 1 : (i + 1) * block_size + 1][None]).item() for i in range(n)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def greedy_sample(model, tokenizer, prompt, n_new=60):
    ids = tokenizer.encode(prompt)
    model.eval()
    for _ in range(n_new):
        x = torch.tensor([ids[-model.config.n_positions :]])
        ids.append(int(model(x, torch.arange(x.shape[1])[None])[0, -1].argmax()))
    model.train()
    return tokenizer.decode(ids)


def token_frequencies(tokens):
    """The training text's tokens, most frequent first, with their counts: what a model trained on it
    writes most (a speculative draft's output layer can be shortlisted to the first few thousand)."""
    ids, counts = torch.unique(torch.as_tensor(tokens), return_counts=True)
    order = counts.argsort(descending=True, stable=True)
    return {"ids": ids[order].tolist(), "counts": counts[order].tolist()}


def write_token_frequencies(out, text_path, tokens):
    record = {"text": Path(text_path).name, "split": "the training tokens (the first 90%)", **token_frequencies(tokens)}
    (Path(out) / "token_frequencies.json").write_text(json.dumps(record) + "\n")


def write_model_card(out, args, text_path, log):
    distilled = f"- Distilled from `{args.teacher}`: trained to match its next-token distributions (KL divergence) rather than the text's next tokens.\n" if args.teacher else ""
    card = f"""# {out.name}

A small GPT-2 ({log['parameters'] / 1e6:.1f}M parameters: {args.n_layer} layers, {args.n_embd} wide,
{args.n_head} heads, context {args.context}, the GPT-2 vocabulary of 50,257 tokens), trained by
`scripts/train.py` of this project. Weights stored in fp16; load_model upcasts them.

- Data: `{text_path.name}`, {log['train_tokens']:,} training tokens, {log['val_tokens']:,} validation tokens (the last 10%).
- Training: {log['steps']:,} steps of {args.batch_size} x {args.block_size} tokens ({log['epochs']:.1f} epochs), AdamW, lr {args.lr} with warmup and cosine decay, {log['minutes']:.1f} minutes on {log['threads']} CPU thread(s) ({log['tokens_per_s']:,.0f} tokens/s).
{distilled}- Validation loss (kept checkpoint, step {log['best_step']:,}): {log['best_val_loss']:.3f} nats/token (perplexity {math.exp(log['best_val_loss']):.0f}).
- Greedy sample from the prompt {log['sample_prompt']!r}:

```
{log['sample']}
```
"""
    (out / "README.md").write_text(card)


def train(args):
    """Train as scripts/train.py describes; `args` carries its command-line options (see its --help)."""
    assert args.block_size <= args.context, "--block-size must not exceed --context"
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text_path, out = Path(args.text), Path(args.out)
    if not text_path.is_file():
        raise SystemExit(f"No text file at {text_path}: pass the path of a UTF-8 text file with --text.")
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = gpt.load_tokenizer()
    tokens = torch.tensor(tokenizer.encode(text_path.read_text(encoding="utf-8"), verbose=False), dtype=torch.long)
    split = int(0.9 * len(tokens))
    train, val = tokens[:split], tokens[split:]
    if len(val) <= args.block_size + 1:
        raise SystemExit(f"{text_path} has {len(tokens)} tokens, too few for --block-size {args.block_size}: use a longer text or a smaller --block-size.")

    config = gpt.GPTConfig(n_positions=args.context, n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head)
    model = gpt.new_model(config)
    teacher = gpt.load_model(args.teacher, device="cpu").eval() if args.teacher else None
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    tokens_per_step = args.batch_size * args.block_size
    steps = args.max_steps or max(1, int(args.epochs * len(train) / tokens_per_step))
    warmup = min(100, steps // 10)

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))

    state_path = out / "train_state.pt"
    start, best, elapsed = 0, {"val_loss": float("inf"), "step": 0}, 0.0
    generator = torch.Generator().manual_seed(args.seed)
    if args.resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        start, best, elapsed = state["step"], state["best"], state["elapsed"]
        print(f"resuming at step {start} (best validation loss so far {best['val_loss']:.3f})")

    model.train()
    data = batches(train, args.block_size, args.batch_size, generator)
    t0 = time.time() - elapsed
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"training {out.name}", unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        x, y = next(data)
        loss = loss_on(model, x, y, teacher)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", best_val=f"{best['val_loss']:.3f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            val_loss = validation_loss(model, val, args.block_size)
            if val_loss < best["val_loss"]:
                best = {"val_loss": val_loss, "step": step + 1}
                gpt.save_model(model, out)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                        "step": step + 1, "best": best, "elapsed": time.time() - t0}, state_path)
            tqdm.write(f"step {step + 1}: train loss {loss.item():.3f}, validation loss {val_loss:.3f}")

    seconds = time.time() - t0
    best_model = gpt.load_model(out, device="cpu")
    prompt = "ROMEO:"
    log = {"parameters": model.num_parameters(), "train_tokens": len(train), "val_tokens": len(val), "steps": steps,
           "epochs": steps * tokens_per_step / len(train), "minutes": seconds / 60, "threads": torch.get_num_threads(),
           "tokens_per_s": (steps - start) * tokens_per_step / max(1e-9, seconds - elapsed), "best_step": best["step"],
           "best_val_loss": best["val_loss"], "teacher": args.teacher, "sample_prompt": prompt, "sample": greedy_sample(best_model, tokenizer, prompt)}
    (out / "training_log.json").write_text(json.dumps(log, indent=2) + "\n")
    write_token_frequencies(out, text_path, train)
    write_model_card(out, args, text_path, log)
    print(f"wrote {out}: validation loss {best['val_loss']:.3f} at step {best['step']}\n{log['sample']}")
