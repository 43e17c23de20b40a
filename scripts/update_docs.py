"""Copy the measured numbers from results/*.json into the README, the decks and the notebooks' prose.

    python scripts/update_docs.py          # rewrite every doc whose marked numbers or tables changed
    python scripts/update_docs.py --check  # only list them (exit code 1 if any)

The markers and the results files are described in workshop/results/store.py.
"""

import argparse
import sys

from workshop import results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="list the stale docs, change nothing")
    args = p.parse_args()
    stale = []
    for path in results.documents():
        text = results.refreshed(path)
        if text != path.read_text():
            stale.append(path.relative_to(results.ROOT))
            if not args.check:
                path.write_text(text)
    print(("stale: " if args.check else "updated: ") + (", ".join(map(str, stale)) or "nothing"))
    sys.exit(1 if args.check and stale else 0)


if __name__ == "__main__":
    main()
