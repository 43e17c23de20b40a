"""Grading setup for `pytest exercises/`: the implementation switch, shared fixtures, per-test
timeouts, short reports for unfinished TODOs, a score table, and a Gradescope results.json."""

import json
import os
import random
import re
import shlex
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import gpt
from workshop.distributed import TodoInRank
from workshop.grading import differential, harness
from workshop.grading.hints import parts as hint_parts
from workshop.grading.wording import plural
from workshop.grading.device_audit import DeviceAudit, on_device

POINTS_PER_EXERCISE = 10
STUBS_DIR = Path(__file__).resolve().parent
HINTS_DIR = STUBS_DIR / "hints"
DEFAULT_TIMEOUT_S = 120  # an infinite loop in student code fails its own test, not the whole run
# What CUDA says once a kernel failed (a device-side assert, a bad address): the process's CUDA context is gone, and
# every later GPU call of this process fails with it. Those later checks are not run, not failed.
GPU_LOST = re.compile(r"device-side assert|CUDA error|illegal memory access|unspecified launch failure|CUBLAS_STATUS_EXECUTION_FAILED")
GPU_LOST_SKIP = "not run: the GPU failed"  # the start of such a check's skip reason


def pytest_addoption(parser):
    group = parser.getgroup("workshop")
    group.addoption("--impl", choices=harness.IMPLS, default=os.environ.get(harness.IMPL_ENV, "exercises"),
                    help="implementation to grade: your exercises/ (default) or the reference solutions/")
    group.addoption("--seed", type=int, default=None, help="seed of the random prompts (default: a new one each run)")
    group.addoption("--examples", type=float, default=None, metavar="FACTOR",
                    help="scale the number of scenarios every differential check generates (default 1: each check's own)")
    group.addoption("--results-json", metavar="PATH", help="also write the scores in Gradescope's results.json format")
    group.addoption("--device-audit", action="store_true",
                    help="fail where a GPU would: a tensor made on the default device meets one on the model's device "
                         "(workshop/grading/device_audit.py; for a CPU-only machine)")
    group.addoption("--replace", action="append", default=[], metavar="MODULE=DOTTED.PATH",
                    help="grade another module in place of MODULE (used by tests/ for negative controls)")


def pytest_configure(config):
    config.addinivalue_line("markers", "timing: wall-clock comparisons (deselect with -m 'not timing')")
    config.addinivalue_line("markers", "slow: statistical checks over thousands of draws (deselect with -m 'not slow')")
    os.environ[harness.IMPL_ENV] = config.getoption("--impl")
    for item in config.getoption("--replace"):
        module, _, path = item.partition("=")
        harness.REPLACEMENTS[module] = path
    if config.getoption("--device-audit"):  # from here on, before the checkers' modules are imported: their constants are host tensors
        config._device_audit = DeviceAudit()
        config._device_audit.__enter__()
    if config.getoption("--examples") is not None:
        os.environ[differential.EXAMPLES_ENV] = str(config.getoption("--examples"))
    if config.getoption("--seed") is None:
        config.option.seed = random.randrange(10_000)
    # One thread: comparable timings, and immune to a busy neighbour. (With two threads on two busy
    # cores, each small op waits for a descheduled thread: measured 15-30x slower on the tiny model.)
    torch.set_num_threads(1)
    # pytest's last lines name each failed check on one line, on a CI runner too (where it would repeat each
    # report in full): the reports above and the causes below say the rest.
    config.option.force_short_summary = True
    config._workshop_results = []


def pytest_unconfigure(config):
    audit = getattr(config, "_device_audit", None)
    if audit is not None:
        audit.__exit__(None, None, None)


def pytest_report_header(config):
    seed = config.getoption("--seed")
    return f"workshop: grading {config.getoption('--impl')}/ on {gpt.default_device()}, prompt seed {seed} (rerun with --seed {seed})"


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S))


# ----------------------------------------------------------------------------------------------
# One GPU failure takes no other check down with it

def pytest_runtest_setup(item):
    lost = getattr(item.config, "_gpu_lost", None)
    if lost:
        pytest.skip(f"{GPU_LOST_SKIP} in {lost} earlier in this process (its CUDA context is unusable): rerun this "
                    f"file alone, e.g. pytest {item.nodeid.split('::')[0]}")


def _gpu_failure(item, call):
    """The error text, if this check's error (or a probe of the GPU after it) says the process's CUDA context is gone."""
    if call.excinfo is not None and GPU_LOST.search(str(call.excinfo.value)):
        return str(call.excinfo.value).strip().splitlines()[0]
    if call.when == "teardown" and torch.device(gpt.default_device()).type == "cuda":
        try:
            torch.cuda.synchronize()  # a kernel of this check may have failed after the check returned
        except RuntimeError as e:
            return str(e).strip().splitlines()[0]
    return None


# ----------------------------------------------------------------------------------------------
# Fixtures shared by the checkers

@pytest.fixture(autouse=True)
def gpu_to_itself(request, device):
    """On a GPU shared by pytest-xdist's workers (-n N), a timing check has the card to itself (harness.gpu_turn)."""
    worker = getattr(request.config, "workerinput", None)
    if torch.device(device).type != "cuda" or worker is None:
        yield
        return
    lock = Path(tempfile.gettempdir()) / f"workshop-gpu-{worker['testrunuid']}"
    with harness.gpu_turn(lock, alone=request.node.get_closest_marker("timing") is not None):
        yield


@pytest.fixture(scope="session")
def seed(request):
    return request.config.getoption("--seed")


@pytest.fixture(scope="session")
def device():
    return gpt.default_device()


# on_device: under --device-audit, these weights are what lives on the model's device (a no-op otherwise).

@pytest.fixture(scope="session")
def model(device):
    return on_device(gpt.load_model("tiny", device=device))


@pytest.fixture(scope="session")
def draft_model(device):
    return on_device(gpt.load_model("tiny-draft", device=device))


@pytest.fixture(scope="session")
def hf_model(device):
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    logging.disable_progress_bar()  # no "Loading weights" bar in a failure's captured output
    return on_device(GPT2LMHeadModel.from_pretrained(gpt.MODELS_DIR / "tiny", dtype=torch.float32).to(device).eval())


@pytest.fixture(scope="session")
def tokenizer():
    return gpt.load_tokenizer()


# ----------------------------------------------------------------------------------------------
# Reports: a TODO left undone reads as such; scores per exercise

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure shows the teaching message, not the checker's source: a check that failed shows its
    message, a crash in your code a short traceback from the checker's line on (no pytest internals), and
    both end with the function to look at and its hints."""
    if call.when == "setup":
        item._scenarios_before = differential.SCENARIOS_TRIED[0]
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":  # how many generated scenarios this check tried (the summary adds them up, across workers)
        report.user_properties.append(("scenarios", differential.SCENARIOS_TRIED[0] - getattr(item, "_scenarios_before", 0)))
    lost = None if getattr(item.config, "_gpu_lost", None) else _gpu_failure(item, call)
    if lost:
        item.config._gpu_lost = item.nodeid
        report.outcome = "failed"
        report.longrepr = (f"The GPU failed in this check ({lost}). On CUDA such a failure (a device-side assert: an index "
                           f"out of range inside a kernel) leaves this process unable to use the GPU at all, so the checks "
                           f"after it in this process are not run (skipped, not scored). Rerun them in a fresh process: "
                           f"pytest {item.nodeid.split('::')[0]}")
        return
    if call.excinfo is None or not report.failed:
        return
    if call.excinfo.errisinstance(NotImplementedError) and _raised_by_a_todo(call.excinfo):
        report.longrepr = f"Not implemented yet. {call.excinfo.value}"
        return
    if call.excinfo.errisinstance(AssertionError):
        text = str(call.excinfo.value).split("\nassert ")[0]  # the message, without pytest's re-evaluation of the expression
    elif call.excinfo.errisinstance(pytest.fail.Exception) and str(call.excinfo.value).startswith("DID NOT RAISE"):
        text = _not_refused(item, call.excinfo)
    else:  # the student's code raised: where, in a few lines, from the checker's line on
        text = _short_traceback(item, call.excinfo)
    cause, line = _cause(call.excinfo, text)
    report.user_properties += [("cause", cause), ("cause line", line)]
    report.longrepr = text + "\n" + _look_at(item, call.excinfo, text)


def _short_traceback(item, excinfo):
    """The traceback from the checker's own frame on, without frames that hide themselves (__tracebackhide__): the
    checker's line, then the code under test down to where it raised."""
    traceback = excinfo.traceback.cut(path=item.path)  # pytest's and pluggy's frames above the check: not yours
    excinfo.traceback = traceback.filter(excinfo)
    return str(excinfo.getrepr(style="short", chain=False, truncate_locals=True))


def _not_refused(item, excinfo):
    """pytest.raises(...) that saw nothing raised: which input should have been refused, from the checker's frame
    (its line, and the plain values it was looping over)."""
    expected = str(excinfo.value).removeprefix("DID NOT RAISE").strip()
    frames = [entry for entry in excinfo.traceback if Path(str(entry.path)) == Path(item.path)]
    if not frames:
        return f"Nothing was raised where the check expects {expected}: that input should have been refused."
    frame = frames[-1]
    line = str(frame.statement).strip()
    inputs = ", ".join(f"{name}={value!r}" for name, value in frame.locals.items()
                       if not name.startswith("_") and _plain(value) and len(repr(value)) <= 80)
    return (f"Nothing was raised where the check expects {expected}: the input it gave should have been refused.\n"
            f"  the check: {line}  ({Path(str(frame.path)).name}:{frame.lineno + 1})\n"
            + (f"  its inputs: {inputs}\n" if inputs else "")
            + f"Refuse it: raise {expected} with one clear sentence before doing any work.")


def _plain(value):
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _cause(excinfo, text):
    """(what makes two failures the same, the line that says it). An error raised by your code: its class and the line
    that raised it, whether a check called your code directly or a differential check did ("yours raised ... (at
    FILE:LINE"). Else the failure's decisive line (after a replay: what differed), numbers masked. A bug that fails
    several checks the same way is then reported in full once."""
    raised = re.search(r"yours raised (\w+): (.*?)\n  \(at (\S+):(\d+), ", text, re.S)
    if raised:
        return f"{raised[1]} at {Path(raised[3]).name}:{raised[4]}", f"{raised[1]}: {(raised[2].splitlines() or [''])[0]}"
    if not (excinfo.errisinstance(AssertionError) or excinfo.errisinstance(pytest.fail.Exception)):
        last = excinfo.traceback[-1]
        message = str(excinfo.value).strip()
        line = f"{type(excinfo.value).__name__}: {message.splitlines()[0] if message else ''}"
        return f"{type(excinfo.value).__name__} at {Path(str(last.path)).name}:{last.lineno + 1}", line
    lines = [ln for ln in text.splitlines() if ln.strip()]
    line = next((ln for ln in lines if ln.startswith("after call")), lines[0] if lines else "")
    line = re.sub(r"^after call \d+, ", "", line)
    return re.sub(r"\d+", "#", line), line


def _hints_of(item):
    number, title = _exercise_of(item.nodeid)
    module_hints = HINTS_DIR / f"ex{number}_{title.replace(' ', '_')}.md"  # an exercise in two modules has one file per module
    hints = module_hints if module_hints.exists() else HINTS_DIR / f"ex{number}.md"
    return hints if hints.exists() else None


def _function_names(section):
    """The functions a hints section is about: "6c: beam_search" -> beam_search, "ChoiceConstraint.allowed (6e)" ->
    ChoiceConstraint.allowed, "6d: StopChecker.add and _safe_length" -> StopChecker.add, _safe_length."""
    section = re.sub(r"^\d+[a-z]?: ", "", section)
    section = re.sub(r" \(.*\)$", "", section)
    return [name.strip() for name in re.split(r",| and ", section) if re.fullmatch(r"[\w.]+", name.strip())]


def _named(name, text):
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def _last_call_method(text, sections):
    """A replay's last call ("after call 7" -> "7. A.free(0)"), its method named as the hints name it
    (BlockAllocator.free): the call after which the two sides parted."""
    last = re.search(r"after call (\d+),", text)
    call = re.search(rf"^  {last[1]}\. (.*)$", text, re.M) if last else None
    if not call:
        return ""
    methods = re.findall(r"\.(\w+)\(", call[1])
    return " ".join(name for s in sections for name in _function_names(s) if any(name.endswith(f".{m}") for m in methods))


def _look_at(item, excinfo, text):
    """The last line of every failure: the function to look at and the command that prints its first hint. The
    function: the deepest one of the code under test that raised and has hints; else the ones the message names
    (its hint line first); else the ones of the check's part (test_6c_... -> 6c)."""
    path = _hints_of(item)
    if path is None:
        return ""
    exercise = path.stem.removeprefix("ex")
    sections = list(hint_parts(exercise))
    chosen = []
    for entry in reversed(excinfo.traceback if not excinfo.errisinstance(AssertionError) else []):
        qualname = getattr(entry.frame.code.raw, "co_qualname", entry.name)
        chosen = [s for s in sections if qualname in _function_names(s)]
        if chosen:
            break
    if not chosen:
        raised = "\n".join(ln for ln in text.splitlines() if "yours raised" in ln)  # a replay where your code raised: its words
        hint_lines = "\n".join(ln for ln in text.splitlines() if "hint" in ln.lower() or "see " in ln.lower())
        doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
        for where in (raised, _last_call_method(text, sections), hint_lines, text, doc):
            found = [(min(m.start() for name in _function_names(s) for m in re.finditer(rf"(?<![\w.]){re.escape(name)}(?![\w])", where)), s)
                     for s in sections if any(_named(name, where) for name in _function_names(s))]
            chosen = [s for _, s in sorted(found)][:2]
            if chosen:
                break
    if not chosen:
        part = re.match(r"test_(\d+[a-z])_", item.name)
        chosen = [s for s in sections if part and s.startswith(f"{part[1]}:")][:2]
    where = path.relative_to(HINTS_DIR.parents[1])
    if not chosen:
        return (f"Stuck? python scripts/hint.py {exercise} shows its hints one at a time, from the idea to near-code "
                f"({where} folds them in a Markdown viewer).")
    names = " and ".join(", ".join(_function_names(s)) for s in chosen)
    short = _function_names(chosen[0])[:1]  # the function's name, where it picks this one section (hint.py takes a piece)
    part = short[0] if short and [s for s in sections if short[0].lower() in s.lower()] == [chosen[0]] else chosen[0]
    return (f"Look at {names}. Stuck? python scripts/hint.py {exercise} {shlex.quote(part)} prints its first hint "
            f"({where}, section {chosen[0]}, has them all).")


def _raised_by_a_todo(excinfo):
    """A TODO left undone raises NotImplementedError in a stub (exercises/exN_*.py), here or in a rank's process.
    Raised anywhere else (torch has no kernel for an op on this device, say), it is an error like any other."""
    if excinfo.errisinstance(TodoInRank):
        return True
    path = Path(str(excinfo.traceback[-1].path))
    return path.parent == STUBS_DIR and path.name.startswith("ex")


def _exercise_of(nodeid):
    match = re.search(r"test_ex(\d+)_(\w+)\.py", nodeid)
    return (int(match.group(1)), match.group(2).replace("_", " ")) if match else (None, nodeid.split("::")[0])


_REPORTS = []  # every report of every test phase, in order


def pytest_runtest_logreport(report):
    _REPORTS.append(report)


def _failures():
    """nodeid -> its first failing report (setup, call or teardown)."""
    failures = {}
    for report in _REPORTS:
        if report.failed:
            failures.setdefault(report.nodeid, report)
    return failures


def _by_cause(failures):
    """cause -> the failed checks' (nodeid, report), the one reported in full first: the shortest report (often the
    smallest scenario) of those that failed the same way."""
    by_cause = defaultdict(list)
    for nodeid, report in failures.items():
        by_cause[dict(report.user_properties).get("cause", nodeid)].append((nodeid, report))
    told_once = lambda report: str(report.longrepr).startswith("The same failure as")  # noqa: E731 - after pytest_sessionfinish
    return {cause: sorted(checks, key=lambda check: (told_once(check[1]), len(str(check[1].longrepr).splitlines())))
            for cause, checks in by_cause.items()}


def pytest_sessionfinish(session):
    """Before the failures are printed: a failure with the same cause as another is told in two lines, and the
    shortest of their reports in full. Here every report is in, over all the workers of -n N."""
    for checks in _by_cause(_failures()).values():
        first = checks[0][0].split("::")[-1]
        for _, report in checks[1:]:
            line = dict(report.user_properties)["cause line"]
            look_at = str(report.longrepr).rstrip().splitlines()[-1]
            report.longrepr = (f"The same failure as {first} (its report is in full): {line[:160]}{' ...' if len(line) > 160 else ''}"
                               f"\n{look_at}")


def _graded_parts(nodeids, config):
    """'' when every check of the checker file ran; else which parts did (after -k, say), so that a score over some
    parts does not read as the whole exercise's."""
    path = Path(config.rootpath) / nodeids[0].split("::")[0]
    if not path.exists():
        return ""
    defined = set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
    ran = {nodeid.split("::")[1].split("[")[0] for nodeid in nodeids if "::" in nodeid}
    left = defined - ran
    if not left:
        return ""
    part = harness.part_of_check
    parts = sorted({part(n) for n in ran} - {""})
    all_parts = sorted({part(n) for n in defined} - {""})
    if not all_parts:
        return f"   graded: {len(ran)} of the checker's {len(defined)} checks (the others not selected)"
    which = f"part{'s' if len(parts) > 1 else ''} {', '.join(parts)} of {', '.join(all_parts)}" if parts != all_parts else "every part"
    return f"   graded: {which} ({len(ran)} of the checker's {len(defined)} checks; the others not selected)"


def _write_causes(terminalreporter, failures):
    """Where several checks failed the same way, one line per cause: fix it, and they all may pass."""
    by_cause = _by_cause(failures)
    if len(by_cause) == len(failures):
        return
    terminalreporter.write_line(f"{plural(len(failures), 'check')} failed, from {plural(len(by_cause), 'cause')}:")
    for checks in by_cause.values():
        (first, report), others = checks[0], [nodeid.split("::")[-1] for nodeid, _ in checks[1:]]
        name, line = first.split("::")[-1], dict(report.user_properties).get("cause line", "")
        terminalreporter.write_line(f"  {name}: {line[:120]}{' ...' if len(line) > 120 else ''}")
        if others:
            terminalreporter.write_line(f"    the same failure as {name} in {', '.join(others)}")


def pytest_terminal_summary(terminalreporter, config):
    skipped = {r.nodeid for r in _REPORTS if r.skipped}  # neither passed nor failed: not scored
    failures = _failures()
    by_exercise = defaultdict(list)
    for nodeid in dict.fromkeys(r.nodeid for r in _REPORTS):
        if nodeid not in skipped:
            by_exercise[_exercise_of(nodeid)].append((nodeid, nodeid not in failures, failures.get(nodeid)))
    if not by_exercise:
        return

    terminalreporter.section("workshop score")
    terminalreporter.write_line(f"{'exercise':<28}{'checks passed':>15}{'points':>10}")
    total, tests = 0.0, []
    for (number, title), rows in sorted(by_exercise.items(), key=lambda kv: (kv[0][0] is None, kv[0])):
        n_passed = sum(passed for _, passed, _ in rows)
        points = POINTS_PER_EXERCISE * n_passed / len(rows)
        total += points
        name = f"{number}. {title}" if number is not None else title
        terminalreporter.write_line(f"{name:<28}{f'{n_passed}/{len(rows)}':>15}{f'{points:.1f}/{POINTS_PER_EXERCISE}':>10}"
                                    f"{_graded_parts([nodeid for nodeid, _, _ in rows], config)}")
        for nodeid, passed, report in rows:
            tests.append({"name": nodeid, "number": "" if number is None else str(number), "status": "passed" if passed else "failed",
                          "score": round(POINTS_PER_EXERCISE / len(rows) * passed, 4),
                          "max_score": round(POINTS_PER_EXERCISE / len(rows), 4),
                          "output": "" if passed else str(report.longrepr)[-4000:]})
    max_total = POINTS_PER_EXERCISE * len(by_exercise)
    terminalreporter.write_line(f"{'total':<43}{f'{total:.1f}/{max_total}':>10}")
    scenarios = sum(value for r in _REPORTS if r.when == "call" for name, value in r.user_properties if name == "scenarios")
    if scenarios:
        terminalreporter.write_line(f"the differential checks tried {scenarios} scenarios (the contract's named edges first, then "
                                    f"generated ones from --seed {config.getoption('--seed')}; --examples 3 tries three times as many)")
    _write_causes(terminalreporter, failures)
    not_run = sorted({r.nodeid for r in _REPORTS if r.skipped and GPU_LOST_SKIP in str(r.longrepr)})
    if not_run:
        files = sorted({nodeid.split("::")[0] for nodeid in not_run})
        terminalreporter.write_line(f"{len(not_run)} checks were not run because the GPU failed earlier in their process "
                                    f"(see the failure that says so); rerun them in a fresh process: pytest {' '.join(files)}")

    path = config.getoption("--results-json")
    if path:
        results = {"score": round(total, 4), "output": f"{total:.1f} of {max_total} points", "tests": tests}
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        terminalreporter.write_line(f"wrote {path} (Gradescope autograder format)")
