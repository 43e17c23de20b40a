"""The GPU check's machinery (scripts/gpu_check.py): steps run as subprocesses with their own time limits,
each in a process group of its own that is killed whole when the step ends or runs out of time; the GPU's
state from nvidia-smi (clocks, other compute processes); what each step's results file says, in one line.

    Step                     one command, its time limit, and how to read its result
    run_step(step, ...)      run it; returns its record (status, seconds, return code, log, output's tail)
    gpu_state()              nvidia-smi's view: the card, clocks, temperature, power, the compute processes
    other_processes(state)   the compute processes on the card that are not this process
    checker_counts(...)      the checkers' pass / fail counts and failing test ids
    files_to_rerun(output)   the checker files a GPU failure cut short (rerun in fresh processes)
    summary_table(records)   the short table printed last
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_FIELDS = ("index", "name", "driver_version", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
              "temperature.gpu", "power.draw", "power.limit", "utilization.gpu", "memory.used", "memory.total",
              "compute_mode", "persistence_mode")
SAFE_GPU_FIELDS = ("index", "name", "driver_version", "clocks.sm", "clocks.mem", "memory.used", "memory.total")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer drivers, older ones


@dataclass
class Step:
    """One command of the check: `argv` (after the Python interpreter), at most `timeout_s` seconds, extra
    environment `env`; `summarize(record)` adds what its results say (a line, and any fields) to its record."""
    name: str
    argv: list
    timeout_s: float
    env: dict = field(default_factory=dict)
    summarize: object = None


def child_env(extra=None):
    """The environment a step runs in: this one, the repository root first on PYTHONPATH (no install needed)."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


try:  # Linux's prctl, loaded before any fork
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent():
    """In the child before exec: SIGKILL when the check's process dies, however it dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_group(pgid, grace_s=5.0, proc=None):
    """SIGTERM to every process of the group, SIGKILL to what is left after `grace_s`. Returns whether any was there.
    `proc`, the group's leader when it is this process's child, is reaped as it ends (a zombie still counts as in the group)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        if proc is not None:
            proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


class Running:
    """The step's process group now running, so that a signal to the check ends it too."""
    pgid = None


def run_step(step, logs_dir, deadline=None, echo=True):
    """Run `step` in a new session (its own process group), its output into logs_dir/<name>.log, for at most
    its timeout or until `deadline` (time.monotonic()); then kill whatever of its group is left. Returns its record."""
    limit = step.timeout_s if deadline is None else min(step.timeout_s, deadline - time.monotonic())
    command = " ".join(["python", *map(str, step.argv)])
    record = {"name": step.name, "command": command, "timeout_s": round(limit, 1)}
    if limit < 5:
        return {**record, "status": "skipped", "seconds": 0.0, "note": "no time left in the check's budget"}
    log = Path(logs_dir) / f"{step.name}.log"
    if echo:
        print(f"[{step.name}] {command}  (at most {limit:.0f} s)", flush=True)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *map(str, step.argv)], cwd=ROOT, env=child_env(step.env), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent)
        Running.pgid = proc.pid
        try:
            returncode, timed_out = proc.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, proc=proc)
            returncode, timed_out = proc.wait(), True
        finally:
            leftovers = kill_group(proc.pid, grace_s=2.0, proc=proc)  # its children (test workers, a server) go with it
            Running.pgid = None
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    status = "timed out" if timed_out else "passed" if returncode == 0 else "failed"
    record.update(status=status, returncode=returncode, seconds=round(seconds, 1), log=str(log),
                  leftover_processes_killed=leftovers)
    if status != "passed":
        record["output_tail"] = text[-3000:]
    if step.summarize:
        try:
            record.update(step.summarize(record, text) or {})
        except Exception as error:  # noqa: BLE001  (a summary that cannot be read is a note, not a crash of the check)
            record.setdefault("note", f"no summary: {type(error).__name__}: {error}")
    if echo:
        print(f"[{step.name}] {status} in {seconds:.1f} s{': ' + record['note'] if record.get('note') else ''}", flush=True)
        if status != "passed":
            print("\n".join(f"    {line}" for line in text.rstrip().splitlines()[-25:]), flush=True)
    return record


def _smi(*args, timeout=20):
    exe = shutil.which("nvidia-smi")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr or proc.stdout).strip()[:300])
    return [[cell.strip() for cell in line.split(",")] for line in proc.stdout.strip().splitlines() if line.strip()]


def _query(kind, fields):
    return [dict(zip(fields, row)) for row in _smi(f"--query-{kind}={','.join(fields)}", "--format=csv,noheader,nounits")]


def gpu_state():
    """What nvidia-smi says now: {"nvidia_smi": False} without it; else every GPU (clocks in MHz, temperature
    in C, power in W, memory in MiB, the active clock-limiting reasons) and the compute processes (pid, name, MiB)."""
    if not shutil.which("nvidia-smi"):
        return {"nvidia_smi": False}
    state = {"nvidia_smi": True, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        try:
            state["gpus"] = _query("gpu", GPU_FIELDS)
        except RuntimeError:  # a field this driver does not know: the few every driver has
            state["gpus"] = _query("gpu", SAFE_GPU_FIELDS)
        for reasons in REASON_FIELDS:
            try:
                for gpu, row in zip(state["gpus"], _query("gpu", ("index", reasons))):
                    gpu["clock_reasons_active"] = row[reasons]
                break
            except RuntimeError:
                continue
        state["compute_processes"] = [{"pid": int(p["pid"]) if p["pid"].isdigit() else p["pid"], **p}
                                      for p in _query("compute-apps", ("pid", "process_name", "used_memory"))]
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        state["error"] = str(error)
    return state


def other_processes(state, own=None):
    """The compute processes nvidia-smi lists that are not `own` (default: this process)."""
    own = {os.getpid()} if own is None else set(own)
    return [p for p in state.get("compute_processes", []) if p["pid"] not in own]


def describe_state(state):
    """One line per GPU: name, clocks against their maximum, temperature, power, memory in use, processes."""
    if not state.get("nvidia_smi"):
        return ["nvidia-smi: not on this machine"]
    if "error" in state:
        return [f"nvidia-smi: {state['error']}"]
    lines = []
    for g in state.get("gpus", []):
        clocks = f"SM {g.get('clocks.sm')}/{g.get('clocks.max.sm', '?')} MHz, memory {g.get('clocks.mem')}/{g.get('clocks.max.mem', '?')} MHz"
        lines.append(f"GPU {g.get('index')}: {g.get('name')}, driver {g.get('driver_version')}, {g.get('pstate', '')} {clocks}, "
                     f"{g.get('temperature.gpu', '?')} C, {g.get('power.draw', '?')}/{g.get('power.limit', '?')} W, "
                     f"{g.get('memory.used')}/{g.get('memory.total')} MiB used, utilisation {g.get('utilization.gpu', '?')}%, "
                     f"clock reasons {g.get('clock_reasons_active', '?')}")
    procs = state.get("compute_processes", [])
    lines.append("compute processes: " + (", ".join(f"{p['pid']} {p['process_name']} ({p['used_memory']} MiB)" for p in procs)
                                          if procs else "none"))
    return lines


SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def checker_counts(output, results_json=None):
    """The checkers' counts from pytest's last summary line ({"passed": 244, "failed": 4, ...}), and the ids of
    the tests that did not pass (from the grading conftest's --results-json file, else pytest's FAILED lines)."""
    import json

    lines = [line for line in output.splitlines() if SUMMARY.search(line) and " in " in line]
    counts = {("errors" if word.startswith("error") else word): int(n) for n, word in SUMMARY.findall(lines[-1])} if lines else {}
    failing = []
    if results_json and Path(results_json).exists():
        failing = [t["name"] for t in json.loads(Path(results_json).read_text())["tests"] if t["status"] != "passed"]
    if not failing:
        failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return counts, failing


GPU_LOST_RERUN = re.compile(r"checks were not run because the GPU failed .*?: pytest (.+)$", re.M)


def files_to_rerun(output):
    """The checker files whose later checks the grading conftest skipped after a GPU failure in their process."""
    found = GPU_LOST_RERUN.findall(output)
    return found[-1].split() if found else []


def summary_table(records):
    """The short table printed last: step, status, seconds, what it measured."""
    rows = [(r["name"], r["status"], f"{r['seconds']:.0f}", r.get("note", "")) for r in records]
    widths = [max(len(row[i]) for row in [("step", "status", "s", "")] + rows) for i in range(3)]
    out = [f"{'step':<{widths[0]}}  {'status':<{widths[1]}}  {'s':>{widths[2]}}  result"]
    out += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows]
    return "\n".join(out)
