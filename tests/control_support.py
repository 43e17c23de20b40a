"""Helpers for the negative controls in tests/controls/ (kept outside that folder: every module
there is a control).

A control usually changes ONE piece of a reference and keeps the rest. When the rest of the
reference calls that piece through its module's globals (generate_batch calls left_pad, Engine
builds a RunningBatch), replacing the name in the control's own module changes nothing, so
reference_with() executes a fresh copy of the reference's file with some globals replaced, and the
control re-exports that copy's public names. The reference module itself is never touched: the
checkers compare against it in the same process.
"""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reference_with(exercise, **replacements):
    """A fresh copy of solutions/<exercise>.py in which each name of `replacements` is rebound."""
    spec = importlib.util.spec_from_file_location(f"tests.controls._copy_of_{exercise}", ROOT / "solutions" / f"{exercise}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)
    for name, value in replacements.items():
        if not hasattr(module, name):
            raise AttributeError(f"solutions/{exercise}.py has no {name!r} to replace")
        setattr(module, name, value)
    return module


def reference_with_edit(exercise, qualname, old, new):
    """A fresh copy of solutions/<exercise>.py in which one function or method (qualname: "f" or "Class.method")
    has the text `old` of its source replaced by `new`: a one-line bug without copying the rest of the function."""
    import inspect
    import textwrap

    module = reference_with(exercise)
    owner_name, _, name = qualname.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
    if source.count(old) != 1:
        raise ValueError(f"{qualname} of solutions/{exercise}.py holds {old!r} {source.count(old)} times, not once: update the control")
    exec(compile(source.replace(old, new), str(ROOT / "solutions" / f"{exercise}.py"), "exec"), vars(module))  # the copy's globals
    if owner_name:  # a method: from the module's namespace onto its class
        setattr(owner, name, vars(module).pop(name))
    return module


def public_names(module):
    """The names a control re-exports: everything the module defines or imports, but private ones."""
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def share_one_tokenizer():
    """Building GPT-2's tokenizer takes seconds, and a runner starts a fresh pytest session per control or part: let
    them share one (the checkers only read it), as scripts/seed_sweep.py does."""
    import functools

    import gpt

    if not hasattr(gpt.load_tokenizer, "cache_info"):
        gpt.load_tokenizer = functools.lru_cache(maxsize=None)(gpt.load_tokenizer)
