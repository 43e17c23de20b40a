"""Results files and the docs' numbers: every measured number the README, the decks and the notebooks
quote comes from results/<name>.json, written by the script that measured it.

    store   save and load results files (with the machine, threads, date and command), look numbers up,
            and fill the docs' marked numbers and tables from them
    tables  the Markdown tables the docs quote, one function per table
"""

from workshop.results.store import (  # noqa: F401  (the package's API: `from workshop import results`)
    NUMBER,
    RESULTS_DIR,
    ROOT,
    TABLE,
    card,
    digest,
    documents,
    file_name,
    fill,
    load,
    lookup,
    machine,
    provenance,
    refreshed,
    save,
    with_dtype,
    without_marked,
)
