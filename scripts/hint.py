"""One hint at a time, in a terminal (a Markdown viewer folds exercises/hints/*.md; `cat` shows them all).

    python scripts/hint.py 2                        # the parts of exercise 2 and their hints' titles
    python scripts/hint.py 2 KVCache.update 1       # hint 1 of that part, and nothing else
    python scripts/hint.py 6_constrained allowed 2  # a part's name may be a unique piece of it
"""

import argparse

from workshop.grading import hints
from workshop.grading.harness import run_script


def main():
    p = argparse.ArgumentParser(description="Show one hint of an exercise at a time.")
    p.add_argument("exercise", help="the exercise: 0-10, or 6_constrained for exercise 6's second module")
    p.add_argument("part", nargs="?", help="the part (a heading of the hints file, or a unique piece of it)")
    p.add_argument("tier", nargs="?", type=int, default=1, help="1: the idea, 2: the shapes or steps, 3: near-code (default 1)")
    args = p.parse_args()
    if args.part is None:
        print(f"Hints of exercise {args.exercise} ({hints.hints_file(args.exercise).name}); open one with "
              f"python scripts/hint.py {args.exercise} PART TIER:")
        for part, tiers in hints.parts(args.exercise).items():
            print(f"  {part}: " + "; ".join(f"{tier} {title}" for tier, title in tiers))
        return
    h = hints.hint(args.exercise, args.part, args.tier)
    print(f"{h.part}, hint {h.tier}: {h.title}\n\n{h.body}")
    if any(other.part == h.part and other.tier == h.tier + 1 for other in hints.hints(args.exercise)):
        print(f"\n(still stuck? python scripts/hint.py {args.exercise} {h.part!r} {h.tier + 1})")


if __name__ == "__main__":
    run_script(main)
