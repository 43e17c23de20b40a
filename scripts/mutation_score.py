"""Mutation score of the checkers of exercises 1-9: how many small bugs planted in the references
(cosmic-ray's mutants of the TODO parts) each checker catches. Writes results/mutation.json.

    python scripts/mutation_score.py                          # exercises 1-9, 30 mutants each (about 2 h on 2 cores)
    python scripts/mutation_score.py --exercises ex3 --sample 0    # every mutant of exercise 3
    python scripts/mutation_score.py --exercises ex6_decoding --list # the mutants, without running them

Each mutant is handed in as a student's exercises/exN_*.py and graded by the checker (`-m "not timing"`, -x,
seed 7) in a private copy of the repository, two at a time with --jobs 2. A sample is drawn per exercise with a fixed seed, so a run is repeatable; the file records
the 95% (Wilson) interval of the kill rate that follows from the sample's size. A survivor is either listed,
with why no input can tell it apart, in exercises/contracts/equivalent_mutants.toml, or a missing check.
The score is killed / (sampled - equivalent).
"""

import argparse
import json
import queue
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workshop import results
from workshop.grading import mutation

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted(p.stem for p in (ROOT / "solutions").glob("ex[1-9]_*.py"))  # the default run: modules 1-9
MORE = ["ex0_bpe", "ex10_attention", "ex11_cuda_graphs"]  # graded on request (--exercises ex0 ex10 ex11)
NAME = "mutation"


def pick(names):
    if not names:
        return EXERCISES
    picked = [e for e in EXERCISES + MORE if any(e == n or e.startswith(n + "_") for n in names)]
    if len(picked) < len(names):
        raise SystemExit(f"pick exercises from {', '.join(EXERCISES + MORE)} (or their prefixes ex1, ex2, ...)")
    return picked


def run_exercise(exercise, size, seed, jobs):
    everything = mutation.mutants(exercise)
    chosen = mutation.sample(everything, size, seed)
    equivalent = mutation.equivalents()
    sandboxes = [mutation.Sandbox() for _ in range(jobs)]
    try:
        base_killed, base_s, base_out = sandboxes[0].grade(exercise, (ROOT / "solutions" / f"{exercise}.py").read_text(), 1800)
        if base_killed:
            raise SystemExit(f"the checker of {exercise} fails the unmutated reference:\n{base_out}")
        timeout = max(60.0, 4 * base_s)

        free = queue.Queue()  # a sandbox grades one mutant at a time: a worker takes a free one and gives it back
        for box in sandboxes:
            free.put(box)

        def one(i_mutant):
            i, mutant = i_mutant
            box = free.get()
            try:
                killed, seconds, output = box.grade(exercise, mutation.mutated_source(mutant), timeout)
            finally:
                free.put(box)
            print(f"  {exercise} {i + 1}/{len(chosen)} {'killed  ' if killed else 'SURVIVED'} {seconds:5.1f}s  {mutant.describe()}",
                  flush=True)
            return mutant, killed, seconds, output

        # `jobs` workers, one sandbox each at any time. (Sandbox i % jobs for mutant i was a race: a worker that finished
        # early took mutant i + jobs into the sandbox still grading mutant i, and one of them was graded on the other's file.)
        with ThreadPoolExecutor(jobs) as pool:
            outcomes = list(pool.map(one, enumerate(chosen)))
    finally:
        for box in sandboxes:
            box.close()
    entry = {
        "mutants": len(everything), "sampled": len(chosen), "killed": sum(k for _, k, _, _ in outcomes),
        "seconds": round(sum(s for _, _, s, _ in outcomes) + base_s, 1), "reference_seconds": round(base_s, 1),
        "survivors": [{"mutant": m.describe(), "operator": m.key, "before": m.before, "after": m.after}
                      for m, killed, _, _ in outcomes if not killed],
        "command": f"python scripts/mutation_score.py --exercises {exercise} --sample {size} --seed {seed}",
    }
    return score(exercise, entry, equivalent)


def score(exercise, entry, equivalent):
    """The entry with its survivors matched against the equivalent mutants, and its score and interval."""
    for survivor in entry["survivors"]:
        if "before" not in survivor:  # written before the lines were kept apart: read them off the description
            survivor["before"], survivor["after"] = re.search(r": `(.*)` -> `(.*)`$", survivor["mutant"]).groups()
        survivor["equivalent"] = equivalent.get((exercise, survivor["before"], survivor["after"]))
    entry["equivalent"] = sum(s["equivalent"] is not None for s in entry["survivors"])
    scored = entry["sampled"] - entry["equivalent"]
    low, high = mutation.wilson_interval(entry["killed"], scored)
    entry["score"] = round(entry["killed"] / scored, 3) if scored else None
    entry["interval_95"] = [round(low, 3), round(high, 3)]
    return entry


def report(exercise, entry):
    unexplained = [s["mutant"] for s in entry["survivors"] if s["equivalent"] is None]
    print(f"{exercise}: {entry['killed']} of {entry['sampled'] - entry['equivalent']} killed (score {entry['score']}, "
          f"95% {entry['interval_95']}), {len(unexplained)} unexplained survivors", *unexplained, sep="\n  ", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exercises", nargs="*", default=[], help="ex1 ... ex9 or full names; default all of 1-9")
    p.add_argument("--sample", type=int, default=30, help="mutants drawn per exercise; 0 = every mutant (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    p.add_argument("--jobs", type=int, default=2, help="mutants graded side by side (default 2)")
    p.add_argument("--list", action="store_true", help="list the mutants of the TODO parts and stop")
    p.add_argument("--rescore", action="store_true", help="match the recorded survivors against the equivalent mutants again "
                   "(after editing exercises/contracts/equivalent_mutants.toml), without running anything")
    args = p.parse_args()
    exercises = pick(args.exercises)
    if args.list:
        for exercise in exercises:
            found = mutation.mutants(exercise)
            print(f"{exercise}: {len(found)} mutants")
            for m in mutation.sample(found, args.sample, args.seed):
                print("  " + m.describe())
        return
    path = results.RESULTS_DIR / f"{NAME}.json"
    record = json.loads(path.read_text()) if path.exists() else {"data": {}, "meta": {}}
    data = record["data"]
    if args.rescore:
        equivalent = mutation.equivalents()
        for exercise in [e for e in exercises if e in data]:
            data[exercise] = score(exercise, data[exercise], equivalent)
            report(exercise, data[exercise])
        path.write_text(json.dumps(record, indent=1) + "\n")  # the same measurement: its meta stays
        return
    start = time.perf_counter()
    for exercise in exercises:
        print(f"{exercise}: grading mutants", flush=True)
        entry = run_exercise(exercise, args.sample, args.seed, args.jobs)
        report(exercise, entry)
        # The file as it is now, this exercise replaced: a --rescore or another run since our start keeps its entries.
        data = json.loads(path.read_text())["data"] if path.exists() else {}
        data[exercise] = entry
        results.save(NAME, dict(sorted(data.items())), repeats=1, jobs=args.jobs, note=(
            "cosmic-ray's core operators on the TODO functions of solutions/exN_*.py; each mutant handed in as the student's "
            "exercises/exN_*.py and graded by its checker (-m 'not timing', -x, seed 7) in a private copy of the repository; score = killed / (sampled - equivalent); "
            "interval_95: Wilson interval of the kill rate for the sample's size"))
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
