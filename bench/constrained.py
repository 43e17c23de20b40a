"""Constrained decoding (exercise 6, parts 6e and 6f): how far its masks agree with outlines-core, and
what the per-state mask cache saves.

    python bench/constrained.py                  # the reference solutions, about a minute on one CPU thread
    python bench/constrained.py --impl exercises # your own ex6_constrained
    python bench/constrained.py --save           # also write results/constrained.json

Agreement: seeded token paths (random allowed tokens, half of them ending inside a UTF-8 character when
one can) through a fixed set of regexes, and through choice lists written as an escaped alternation
(longest choice first: regex-automata's leftmost-first alternation would never extend an earlier one); in
every state the mask over GPT-2's whole vocabulary is compared with outlines-core's Index. outlines-core
0.2.14 leaves out one kind of token (after whose bytes but the last the text already fully matches while
the whole text does not: regex-automata reports a match one byte late); those are counted apart.

Cache: constrained greedy generation of a JSON-ish answer for several prompts with one constraint (as a
server would keep a compiled constraint): how many mask requests the cache answered, what a build and a
lookup cost, and the generation time with the cache against the same run rebuilding every mask.
"""

import argparse
import os
import random
import re
import statistics
import time

import torch

import gpt
from workshop import results
from workshop.figures.constrained import JSON_PROMPT, JSON_REGEX
from workshop.grading.harness import IMPL_ENV, IMPLS, implementation, run_script
from workshop.serving.workloads import sample_prompts

REGEXES = [
    r"[0-9]{1,3}(\.[0-9]{1,2})?",
    r"-?[0-9]+(\.[0-9]+)?",
    r"(yes|no|maybe)",
    r'\{"name": "[A-Za-z ]{1,12}", "age": [0-9]{1,2}\}',
    JSON_REGEX,
    r"(café|naïve|crème|😀) [a-z]{1,8}",
    r'[^"\n]{0,8}"',
    r".{1,5}",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
]
CHOICES = [[" yes", " no", " maybe"], [" Romeo", " Juliet", " the Friar", " Tybalt"],
           [" to be", " to be or not to be", " café au lait", " ☺"], ["Northumberland", "North", "Norfolk"]]


def parse_args():
    p = argparse.ArgumentParser(description="Constrained decoding: mask agreement with outlines-core, and the mask cache.")
    p.add_argument("--impl", choices=IMPLS, default=os.environ.get(IMPL_ENV, "solutions"))
    p.add_argument("--walks", type=int, default=3, help="token paths per regex")
    p.add_argument("--steps", type=int, default=12, help="tokens per path at most")
    p.add_argument("--prompts", type=int, default=4, help="prompts for the cache measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write results/constrained.json")
    return p.parse_args()


def allowed_ids(mask):
    return set(mask.nonzero().flatten().tolist())


def quirk_tokens(reference, ref_state, ours, vocab):
    """The tokens of `ours` that outlines-core's Index leaves out by its one-byte-late match report."""
    quirk = set()
    for token in ours - {vocab.eos_token_id}:
        before_last, whole = reference._walk(ref_state, vocab.tokens[token][:-1]), reference._walk(ref_state, vocab.tokens[token])
        if before_last is not None and before_last[1] == b"" and before_last[0] in reference.dfa.accepting and (
                whole[1] or whole[0] not in reference.dfa.accepting):
            quirk.add(token)
    return quirk


def agreement(module, vocab, args):
    from outlines_core import Index, Vocabulary

    import solutions.ex6_constrained as reference

    outlines_vocab = Vocabulary(vocab.eos_token_id, {token: [i] for token, i in vocab.index.items()})
    rng = random.Random(args.seed)
    cases = [("regex", p, module.RegexConstraint(p, vocab), p) for p in REGEXES]
    # choices as outlines-core would take them: an escaped alternation, longest first (regex-automata's
    # leftmost-first alternation never extends a match of an earlier alternative: in " to be| to be or not
    # to be" the second is unreachable)
    cases += [("choices", c, module.ChoiceConstraint(c, vocab), "|".join(re.escape(x) for x in sorted(c, key=len, reverse=True)))
              for c in CHOICES]
    counts = {"states": 0, "equal_states": 0, "quirk_states": 0, "quirk_tokens": 0, "mismatched_tokens": 0}
    by_kind = {"regex": 0, "choices": 0}
    build_ms, index_ms = [], []
    for kind, spec, constraint, pattern in cases:
        start = time.perf_counter()
        index = Index(pattern, outlines_vocab)
        index_ms.append((time.perf_counter() - start) * 1e3)
        ref = reference.RegexConstraint(pattern, vocab)
        for _ in range(args.walks):
            state, ref_state, theirs = constraint.start(), ref.start(), index.get_initial_state()
            for _ in range(args.steps):
                start = time.perf_counter()
                ours = allowed_ids(constraint.allowed(state))
                build_ms.append((time.perf_counter() - start) * 1e3)
                outlines = set(index.get_allowed_tokens(theirs) or [])
                quirk = quirk_tokens(ref, ref_state, allowed_ids(ref.allowed(ref_state)), vocab)
                counts["states"] += 1
                by_kind[kind] += 1
                counts["equal_states"] += ours == outlines
                counts["quirk_states"] += bool(quirk)
                counts["quirk_tokens"] += len(quirk)
                counts["mismatched_tokens"] += len(ours ^ (outlines | quirk))
                tokens = sorted(outlines - {vocab.eos_token_id})
                if not tokens:
                    break
                partial = [t for t in tokens if vocab.texts[t] is None or vocab.texts[t][1]]
                token = rng.choice(partial if partial and rng.random() < 0.5 else tokens)
                state, ref_state, theirs = constraint.advance(state, token), ref.advance(ref_state, token), index.get_next_state(theirs, token)
    return {**counts, "regex_states": by_kind["regex"], "choice_states": by_kind["choices"], "regexes": len(REGEXES),
            "choice_lists": len(CHOICES), "vocab_size": vocab.size, "token_decisions": counts["states"] * vocab.size,
            "outlines_index_ms_median": statistics.median(index_ms)}


def cache_effect(module, model, tokenizer, vocab, args):
    from workshop.serving.sampling import GREEDY

    prompts = [tokenizer.encode(JSON_PROMPT)] + sample_prompts(model, args.prompts - 1, 4, 24, args.seed)
    constraint = module.RegexConstraint(JSON_REGEX, vocab)
    masks = getattr(constraint, "masks", None)
    calls, builds, build_s, lookup_s = 0, 0, [], []
    original = constraint.allowed

    def counted(state):
        nonlocal calls, builds
        calls += 1
        new = masks is not None and state not in masks
        start = time.perf_counter()
        mask = original(state)
        (build_s if new else lookup_s).append(time.perf_counter() - start)
        builds += new
        return mask

    constraint.allowed = counted
    tokens = sum(len(module.generate(model, p, constraint, 48, GREEDY)) for p in prompts)

    def run(clear):
        c = module.RegexConstraint(JSON_REGEX, vocab)
        if clear:
            rebuild = c.allowed
            c.allowed = lambda state: (c.masks.clear(), rebuild(state))[1]
        start = time.perf_counter()
        for p in prompts:
            module.generate(model, p, c, 48, GREEDY)
        return time.perf_counter() - start

    cached, uncached = [], []
    for _ in range(args.repeats):
        cached.append(run(False)), uncached.append(run(True))
    return {"prompts": len(prompts), "tokens": tokens, "mask_requests": calls, "masks_built": builds,
            "hits": calls - builds, "hit_rate": (calls - builds) / calls,
            "build_ms_median": statistics.median(build_s) * 1e3, "lookup_us_median": statistics.median(lookup_s) * 1e6,
            "generation_s_cached": statistics.median(cached), "generation_s_uncached": statistics.median(uncached),
            "uncached_slowdown": statistics.median(u / c for u, c in zip(uncached, cached))}


def main():
    args = parse_args()
    torch.set_num_threads(1)
    module = implementation("ex6_constrained", args.impl)
    model, tokenizer = gpt.load_model("tiny", device="cpu"), gpt.load_tokenizer()  # on the CPU, as it says and saves
    print(f"tiny on cpu, {args.impl}/ex6_constrained.py, 1 torch thread, seed {args.seed}", flush=True)
    start = time.perf_counter()
    vocab = module.Vocabulary.from_tokenizer(tokenizer)
    vocab_s = time.perf_counter() - start
    agree = agreement(module, vocab, args)
    print(f"agreement with outlines-core: {agree['states']} states ({agree['regex_states']} in {agree['regexes']} regexes, "
          f"{agree['choice_states']} in {agree['choice_lists']} choice lists) x {agree['vocab_size']:,} tokens; "
          f"{agree['equal_states']} states exactly equal, {agree['quirk_states']} differ only by outlines' late-match quirk "
          f"({agree['quirk_tokens']} tokens), {agree['mismatched_tokens']} tokens differ otherwise")
    cache = cache_effect(module, model, tokenizer, vocab, args)
    print(f"cache: {cache['mask_requests']} mask requests over {cache['tokens']} tokens of {cache['prompts']} prompts, "
          f"{cache['masks_built']} built ({cache['build_ms_median']:.1f} ms median), {cache['hits']} from the cache "
          f"({cache['hit_rate']:.0%}, {cache['lookup_us_median']:.1f} us median); generation {cache['generation_s_cached']:.2f} s "
          f"with the cache, {cache['generation_s_uncached']:.2f} s rebuilding every mask ({cache['uncached_slowdown']:.1f}x)")
    if args.save:
        path = results.save("constrained", {"vocabulary_s": vocab_s, "agreement": agree, "cache": cache}, repeats=args.repeats,
                            impl=args.impl, seed=args.seed, model="tiny")
        print(f"wrote {path.relative_to(results.ROOT) if path.is_relative_to(results.ROOT) else path}")


if __name__ == "__main__":
    run_script(main)
