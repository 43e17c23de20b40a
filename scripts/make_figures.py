"""Regenerate the slides' figures (slides/figures/*.png) from the project's own code.

    python scripts/make_figures.py                # every module's figures
    python scripts/make_figures.py --module 2     # only module 2's
    python scripts/make_figures.py --list         # what would be drawn

The figures, what they measure and how they are saved are in workshop/figures/decks.py (each a function
registered with @figure(module, filename), measuring and drawing with its course module's file in
workshop/figures/); this script only picks them and calls decks.draw(). The timings are measured on the
machine that runs this script: run it on a quiet machine.

What the figures measure goes to results/figures.json (workshop/results/store.py), from which
`python scripts/update_docs.py` fills the numbers the decks quote. Each figure's drawn size, smallest
font and the results files it was drawn from go there too, so that tests/test_slides.py fails once a
file is re-measured and the figure not redrawn (`python scripts/make_figures.py --only FILE.png`
redraws one).
"""

import argparse
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from workshop.figures import decks  # noqa: E402 (after choosing the backend)
from workshop.grading.harness import IMPL_ENV  # noqa: E402


def main():
    p = argparse.ArgumentParser(description="Regenerate slides/figures/*.png from the project's code.")
    p.add_argument("--module", type=int, nargs="+", choices=sorted(decks.REGISTRY), help="only these modules (default: all)")
    p.add_argument("--out", type=Path, default=decks.OUT_DIR)
    p.add_argument("--impl", default=os.environ.get(IMPL_ENV, "solutions"), choices=("exercises", "solutions"))
    p.add_argument("--device", default="cpu", help="cpu (default, as the slides say) or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1, as in the notebooks: steady timings even on a busy machine)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per length for the timing figures (median)")
    p.add_argument("--only", nargs="+", metavar="FILE.png", help="only these figures (e.g. one drawn from a re-measured results file)")
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    args = p.parse_args()

    try:
        selected = decks.selected(args.module, args.only)
    except ValueError as error:
        p.error(str(error))
    if args.list:
        for m, name, fn in selected:
            print(f"module {m}: {name}  ({fn.__name__})")
        return
    decks.draw(selected, out=args.out, impl=args.impl, device=args.device, threads=args.threads, repeats=args.repeats)


if __name__ == "__main__":
    main()
