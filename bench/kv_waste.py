"""Where KV-cache memory goes, in vLLM's words (Kwon et al., SOSP 2023, section 3): of the token slots an
engine holds at each step, the share that holds a token, and the waste split three ways:

  reservation               slots held now for a token the request will write later
  internal fragmentation    slots held by a request that it never writes: left padding, a finished row still
                            held, the end of an allocation beyond where the request stopped
  external fragmentation    free memory no request can use because it is not in one piece

    python bench/kv_waste.py          # the reference engines, a minute on 2 cores
    python bench/kv_waste.py --save   # also write results/kv_waste.json (what deck 5 quotes)

One workload (32 mixed requests, prompts of 8-64 tokens, up to 8-96 new tokens, stopping at EOS when the
model writes it), batch size 8, on each engine's own schedule:

  static      exercise 3: batches of 8, each one left-padded cache, every row held until the batch ends
  continuous  exercise 4: one left-padded running batch, rows joining and leaving every step
  reserved    exercise 4's schedule with each request's prompt + max_new_tokens reserved at admission, as
              serving systems did before paging (vLLM's baseline)
  paged       exercise 5: blocks of 16 allocated on demand

Counted in slots summed over the steps (a step that holds more weighs more). External fragmentation needs a
fixed pool: the padded engines have none (their cache is a new tensor each step: torch's allocator, not
measured), the reserved one is simulated first-fit in a pool as large as its peak, and paging has none by
construction (any free block serves any sequence).
"""

import argparse
import os

import torch

from workshop import results
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import mixed_workload

BATCH, BLOCK = 8, 16


def parse_args():
    p = argparse.ArgumentParser(description="KV waste of the static, continuous and paged engines: reservation, internal and external fragmentation.")
    p.add_argument("--impl", choices=IMPLS, default=os.environ.get(IMPL_ENV, "solutions"),
                   help="whose engines: the reference solutions/ (default) or your exercises/")
    p.add_argument("--model", default="tiny", help="the model (default: the embedded tiny)")
    p.add_argument("--save", action="store_true", help="write results/kv_waste.json")
    return p.parse_args()


def shares(held, tokens, reservation, internal, external=0):
    """Shares of the held slots (plus the unusable free ones), summed over the steps."""
    total = held + external
    return {"slots": total, "tokens": tokens / total, "reservation": reservation / total,
            "internal_fragmentation": internal / total, "external_fragmentation": external / total}


def static_waste(ex3, model, workload):
    """Exercise 3's batches, analytically from their outputs: a batch's cache is rows x (longest prompt + steps)."""
    held = tokens = 0
    for start in range(0, len(workload), BATCH):
        prompts = workload.prompts[start:start + BATCH]
        outputs = ex3.generate(model, prompts, workload.max_new_tokens[start:start + BATCH], BATCH).outputs
        longest, steps = max(map(len, prompts)), max(map(len, outputs))
        for s in range(steps):  # the forward of step s writes positions up to longest + s - 1 (the last token is never cached)
            width = longest + s
            held += width * len(prompts)
            tokens += sum(len(p) + min(s, len(o) - 1) for p, o in zip(prompts, outputs))
    return shares(held, tokens, 0, held - tokens)


def continuous_and_reserved(ex4, model, workload):
    """Exercise 4 watched at each step (its running batch just before finished rows leave)."""
    engine = ex4.Engine(model, BATCH)
    running, remove = engine.running, engine.running.remove
    steps = []  # per step: [(request index, tokens cached now)], rows x width

    def watched(done):
        lengths = running.mask.sum(dim=1).tolist()
        steps.append(([(seq.id, int(n)) for seq, n in zip(running.seqs, lengths)], running.mask.numel()))
        return remove(done)

    running.remove = watched
    result = engine.run([ex4.Request(p, n) for p, n in zip(workload.prompts, workload.max_new_tokens)])
    final = {seq.id: len(seq.request.prompt_ids) + len(seq.output_ids) - 1 for seq in result.sequences}
    reserve = {seq.id: len(seq.request.prompt_ids) + seq.request.max_new_tokens for seq in result.sequences}
    held = sum(slots for _, slots in steps)
    tokens = sum(n for rows, _ in steps for _, n in rows)
    continuous = shares(held, tokens, 0, held - tokens)
    r_held = sum(reserve[i] for rows, _ in steps for i, _ in rows)
    r_later = sum(final[i] - n for rows, _ in steps for i, n in rows)
    r_never = sum(reserve[i] - final[i] for rows, _ in steps for i, _ in rows)
    external = first_fit_external([[(i, reserve[i]) for i, _ in rows] for rows, _ in steps])
    return continuous, shares(r_held, tokens, r_later, r_never, external)


def first_fit_external(steps):
    """Contiguous reservations placed first-fit in a pool as large as the peak sum of reservations: per step,
    the free slots that lie in holes too small for the next waiting reservation (or, when nobody waits, in
    holes smaller than the smallest reservation seen). Returns those slots summed over the steps."""
    pool = max(sum(size for _, size in rows) for rows in steps)
    placed, external, smallest = {}, 0, min(size for rows in steps for _, size in rows)
    for k, rows in enumerate(steps):
        alive = {i for i, _ in rows}
        placed = {i: span for i, span in placed.items() if i in alive}
        for i, size in rows:
            if i in placed:
                continue
            edges = sorted(placed.values())
            start, cursor = None, 0
            for s, e in edges + [(pool, pool)]:
                if s - cursor >= size:
                    start = cursor
                    break
                cursor = max(cursor, e)
            if start is None:  # it does not fit in one piece: the pool grows (counted: its holes were unusable)
                start = max((e for _, e in edges), default=0)
                pool = max(pool, start + size)
            placed[i] = (start, start + size)
        edges, cursor, holes = sorted(placed.values()), 0, []
        for s, e in edges + [(pool, pool)]:
            if s > cursor:
                holes.append(s - cursor)
            cursor = max(cursor, e)
        upcoming = [size for i, size in (steps[k + 1] if k + 1 < len(steps) else []) if i not in placed]
        need = min(upcoming) if upcoming else smallest
        external += sum(h for h in holes if h < need)
    return external


def paged_waste(ex5, model, workload):
    """Exercise 5 watched after each step's schedule: each running sequence's slots and tokens reserved."""
    engine = ex5.Engine(model, BATCH, block_size=BLOCK)
    schedule, steps = engine.schedule, []

    def watched():
        scheduled = schedule()
        if scheduled:
            steps.append([(seq.id, len(seq.block_table.blocks) * BLOCK, seq.block_table.num_tokens) for seq in engine.running])
        return scheduled

    engine.schedule = watched
    result = engine.run([ex5.Request(p, n) for p, n in zip(workload.prompts, workload.max_new_tokens)])
    final = {seq.id: len(seq.request.prompt_ids) + len(seq.output_ids) - 1 for seq in result.sequences}
    held = sum(slots for rows in steps for _, slots, _ in rows)
    tokens = sum(n for rows in steps for _, _, n in rows)
    later = sum(min(slots, final[i]) - n for rows in steps for i, slots, n in rows)
    return shares(held, tokens, later, held - tokens - later)


def main():
    args = parse_args()
    import gpt

    torch.set_num_threads(1)
    model = gpt.load_model(args.model)
    ex3, ex4, ex5 = (implementation(name, args.impl) for name in ("ex3_static_batching", "ex4_continuous_batching", "ex5_paged_kv_cache"))
    workload = mixed_workload(model, 32, prompt_len=(8, 64), output_len=(8, 96), seed=0)
    continuous, reserved = continuous_and_reserved(ex4, model, workload)
    engines = {"static": static_waste(ex3, model, workload), "continuous": continuous, "reserved": reserved,
               "paged": paged_waste(ex5, model, workload)}
    print(f"{'engine':<12}{'tokens':>8}{'reservation':>13}{'internal':>10}{'external':>10}")
    for name, e in engines.items():
        print(f"{name:<12}{e['tokens']:>8.0%}{e['reservation']:>13.0%}{e['internal_fragmentation']:>10.0%}{e['external_fragmentation']:>10.0%}")
    if args.save:
        path = results.save("kv_waste", {"requests": len(workload), "batch_size": BATCH, "block_size": BLOCK, "engines": engines},
                            repeats=1, impl=args.impl, model=args.model)
        print(f"wrote {path.relative_to(results.ROOT)}")


if __name__ == "__main__":
    run_script(main)
