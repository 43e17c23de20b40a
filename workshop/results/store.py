"""Results files: every measured number in the README, the decks and the notebooks' prose comes from
one of these, written by the script that measured it, and is copied into the docs by
`python scripts/update_docs.py`, never typed by hand.

A results file is results/<name>.json: {"meta": {...how it was measured...}, "data": {...}}. A measurement
made on a GPU goes to results/<name>_<card>.json (serving_h200.json, attention_h100.json: `file_name`), so
the CPU numbers the docs quote and a GPU's stay side by side.
In a Markdown file (or a notebook's Markdown cell) a number is a marked span,

    <!--r:serving:data.engines.continuous.tokens_per_s:,.0f-->785<!--/r-->

(file `serving`, dotted path into its JSON, optional Python format spec), and a whole table is a block,

    <!--table:serving:engines-->
    | engine | tokens/s | ... |
    <!--/table-->

drawn by the function registered for it with @table("serving", "engines"). Marp and GitHub hide the
comments, so readers see only the numbers; tests/test_docs_numbers.py fails when a doc and its
results file disagree.
"""

import datetime
import hashlib
import json
import os
import platform
import re
import sys
from pathlib import Path

import torch

from workshop.results.tables import TABLES

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = Path(os.environ.get("WORKSHOP_RESULTS_DIR") or ROOT / "results")  # the tests point it elsewhere
NUMBER = re.compile(r"<!--r:(?P<file>[\w-]+):(?P<path>[^:>]+)(?::(?P<fmt>[^>]*?))?-->(?P<value>.*?)<!--/r-->", re.S)
TABLE = re.compile(r"<!--table:(?P<file>[\w-]+):(?P<name>[\w-]+)-->\n(?P<body>.*?)<!--/table-->", re.S)


def machine(device="cpu"):
    """The machine a measurement on `device` ran on, in words: the card for a GPU's, the CPU for a CPU's
    (also on a machine that has a GPU)."""
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name(torch.device(device))} GPU"
    cpu = platform.processor() or platform.machine()
    try:  # the CPU model, where Linux says it
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()}-core CPU ({cpu})"


VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "intel"}


def card(device="cuda"):
    """A short lowercase tag of the GPU behind `device`: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" ->
    "h100", "NVIDIA GeForce RTX 4090" -> "rtx4090", "NVIDIA A100-SXM4-80GB" -> "a100". The vendor's words
    go, then the words up to the first one with a digit in it (the model number) are kept, with a "Ti" or
    "Super" right after it."""
    words = [w for w in re.split(r"[\s_-]+", torch.cuda.get_device_name(torch.device(device)).lower())
             if w and w not in VENDOR_WORDS]
    numbered = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), None)
    if numbered is not None:
        words = words[:numbered + 1] + [w for w in words[numbered + 1:numbered + 2] if w in ("ti", "super")]
    return re.sub(r"[^a-z0-9]", "", "".join(words)) or "gpu"


def file_name(name, device="cpu"):
    """The results name a measurement of `name` on `device` is saved under (results/<that>.json): `name`
    itself on the CPU, `name`_<card> on a GPU ("serving" on an H200 -> "serving_h200"). save() and load()
    go through it; a script that writes or reloads a file of its own beside one (serving_rows) does too."""
    return f"{name}_{card(device)}" if torch.device(device).type == "cuda" else name


def with_dtype(name, dtype):
    """The results name of a measurement in `dtype` (a --dtype name): `name` in float32, what the docs quote;
    `name`_<dtype> in another, beside it (serving -> serving_float16; on a GPU file_name adds the card)."""
    return name if dtype == "float32" else f"{name}_{dtype}"


def save(name, data, repeats, device="cpu", **meta):
    """Write results/<name>.json (on a GPU results/<name>_<card>.json: `file_name`): `data` and how it was
    measured (machine, device, threads, repeats, date, command; on a GPU the card's full name)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    gpu = {"card": torch.cuda.get_device_name(torch.device(device))} if torch.device(device).type == "cuda" else {}
    record = {"meta": {"machine": machine(device), "device": str(device), **gpu, "threads": torch.get_num_threads(), "repeats": repeats,
                       "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                       "command": " ".join(["python", _script(), *sys.argv[1:]]),
                       **meta},
              "data": data}
    path = RESULTS_DIR / f"{file_name(name, device)}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _script():
    """The running script's path relative to the repository (bench/serving.py), as one would type it."""
    path = Path(sys.argv[0]).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else sys.argv[0]


def load(name, device="cpu"):
    """results/<name>.json, or what a measurement on `device` saved (`file_name`)."""
    path = RESULTS_DIR / f"{file_name(name, device)}.json"
    if not path.exists():
        raise FileNotFoundError(f"No results file {path.relative_to(ROOT)}: run the script that measures it (see its 'command').")
    return json.loads(path.read_text())


def lookup(record, dotted):
    value = record
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def digest(record, part=None):
    """A short digest of a results record's data (all of it, or the dotted `part` of "data"): what a
    figure drawn from that data records, so that a re-measured file shows which figures are stale."""
    value = lookup(record, "data" if part is None else f"data.{part}")
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def provenance(name, record, part=None):
    """Where a figure's numbers come from: the file, its part, the date it was measured, the data's digest."""
    return {"file": f"results/{name}.json", **({"part": part} if part else {}), "date": record["meta"].get("date"),
            "digest": digest(record, part)}




def fill(text):
    """`text` with every marked number and table recomputed from the results files."""
    cache = {}

    def record(file):
        if file not in cache:
            cache[file] = load(file)
        return cache[file]

    def number(m):
        value = lookup(record(m["file"]), m["path"])
        return f"<!--r:{m['file']}:{m['path']}{':' + m['fmt'] if m['fmt'] else ''}-->{format(value, m['fmt'] or '')}<!--/r-->"

    def block(m):
        draw = TABLES.get((m["file"], m["name"]))
        if draw is None:
            raise KeyError(f"no table {m['name']!r} registered for results/{m['file']}.json (see workshop/results/tables.py)")
        return f"<!--table:{m['file']}:{m['name']}-->\n{draw(record(m['file'])).rstrip()}\n<!--/table-->"

    return TABLE.sub(block, NUMBER.sub(number, text))


def without_marked(text):
    """`text` with its marked numbers and tables removed: what is left was typed by hand."""
    return NUMBER.sub("", TABLE.sub("", text))


def documents():
    """Every file whose prose may quote a measured number: the README and docs/measured_numbers.md, the decks, the
    notebooks. (docs/benchmarks.md is written whole from its results file by bench/serving.py.)"""
    return [ROOT / "README.md", ROOT / "docs" / "measured_numbers.md", *sorted((ROOT / "slides").glob("*.md")),
            *sorted((ROOT / "notebooks").glob("*.ipynb"))]


def refreshed(path):
    """The file's text with its marked numbers and tables recomputed (a notebook: its Markdown cells)."""
    text = path.read_text()
    if path.suffix != ".ipynb":
        return fill(text)
    notebook = json.loads(text)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            source = fill("".join(cell["source"]))
            cell["source"] = source.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
