"""Several processes joined by torch.distributed (gloo on CPU): what exercise 9's checker, notebook and
benchmark run their ranks with, without depending on the student's own launcher.

    pool = ProcessPool()
    results = pool.run(fn, 2, "tiny")     # fn(rank, 2, "tiny") on ranks 0 and 1, their results in rank order
    pool.close()

A ProcessPool keeps its processes for its whole life (starting Python and torch costs a second or two
of CPU per process), and joins the ones a run needs in a fresh gloo group for each run. A run that a
rank fails raises here: NotImplementedError with the rank's own message when the rank hit a TODO (so the
grading report reads "Not implemented yet. Exercise 9: ..."), RankError with the rank's traceback for
any other exception (of the first rank that failed for its own reason: a peer's "Connection closed by
peer" that the failure caused is named as its echo, never reported in its place, whatever the load),
RankTimeout when ranks do not answer in time (a collective that not every rank reaches waits forever);
after a timeout the pool starts afresh.

CollectiveLog records every collective operation that the code inside it runs, however it is called
(dist.all_reduce, a process group's allreduce, torch's functional collectives).
"""

import datetime
import itertools
import os
import pickle
import queue
import re
import socket
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree

LOOPBACK = "127.0.0.1"


def free_port():
    """A TCP port of the loopback interface that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def use_loopback_for_gloo():
    """Make gloo connect the ranks through the loopback interface (GLOO_SOCKET_IFNAME), unless the user chose
    one: by default gloo uses the address the machine's hostname resolves to, which in some containers no
    process can reach. New processes inherit the setting."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
        if names:
            os.environ["GLOO_SOCKET_IFNAME"] = names[0]


# ----------------------------------------------------------------------------------------------
# Errors of a run

class RankError(AssertionError):
    """A rank raised: the message holds its exception and traceback. (An AssertionError, so that the grading
    report shows this message, the rank's own traceback, rather than the parent's frames.)"""


class TodoInRank(NotImplementedError):
    """A rank stopped at a TODO left undone in a stub (exercises/exN_*.py). The grading report says "Not
    implemented yet" for it, as for a TODO met in the test's own process; any other error is a RankError."""


class RankTimeout(AssertionError):
    """Ranks did not answer in time: a failure of the code under test, reported as a failed check."""


def _describe(error):
    """The exception as plain data, with a traceback of the frames in the project's own files (the student's
    code, the checks), not those inside torch, Python or this module."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if "site-packages" not in f.filename and "/lib/python3" not in f.filename
           and not f.filename.endswith(("workshop/distributed.py", "<frozen runpy>"))]
    text = "".join(traceback.format_list(own or frames[-4:]) + traceback.format_exception_only(error))
    in_stub = bool(frames) and re.search(r"exercises/ex\d+_\w+\.py$", frames[-1].filename.replace(os.sep, "/"))
    return {"type": type(error).__name__, "message": str(error), "traceback": text,
            "todo": isinstance(error, NotImplementedError) and bool(in_stub)}


def _short_traceback(text, keep=16):
    lines = text.rstrip().splitlines()
    return "\n".join(lines if len(lines) <= keep else ["  ..."] + lines[-keep:])


# What a rank raises when a PEER died or left the group: an echo of another rank's failure, not a failure of its own.
PEER_LOST = re.compile(r"connection (closed|reset|refused)|broken pipe|ECONNRESET|EPIPE|ECONNREFUSED|peer (closed|disconnected)"
                       r"|socket (closed|timeout)|Connection was likely closed", re.IGNORECASE)


def is_peer_lost(error):
    """Whether a rank's error (as _describe gives it) says only that another rank went away."""
    return bool(PEER_LOST.search(error["message"]))


def first_failure(errors, arrival):
    """The rank to report among those that raised (errors: rank -> _describe(...), arrival: ranks in the order
    their replies came): the first to fail for its OWN reason; a connection error that a dead peer caused in
    another rank (which may even arrive first when the machine is loaded) only when no rank has another error."""
    ordered = [rank for rank in arrival if rank in errors] + sorted(set(errors) - set(arrival))
    return next((rank for rank in ordered if not is_peer_lost(errors[rank])), ordered[0])


COLLECTIVES_HINT = ("Every rank must run the same collectives (all_reduce ...) in the same order, on tensors of the same size: "
                    "a rank that runs one more, one fewer or a different size leaves the others waiting forever, or makes "
                    "gloo abort them.")


# ----------------------------------------------------------------------------------------------
# The pool

def _worker(index, tasks, replies):
    """One long-lived process: for each task, join a gloo group as rank `index`, run the function, reply."""
    torch.set_num_threads(1)  # several processes share the machine's cores: one thread each
    while True:
        task = tasks.get()
        if task is None:
            replies.close()
            replies.join_thread()  # every reply delivered; then leave without the slow interpreter teardown
            os._exit(0)
        task_id, fn, world_size, port, args, timeout_s = task
        try:
            dist.init_process_group("gloo", init_method=f"tcp://{LOOPBACK}:{port}", rank=index, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            reply = ("ok", pickle.dumps(fn(index, world_size, *args)))
        except BaseException as error:  # noqa: BLE001 (everything goes back to the parent, which decides)
            reply = ("error", _describe(error))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        replies.put((task_id, index, *reply))


class ProcessPool:
    """Up to max_world_size spawned processes, started when a run first needs them and kept until close()."""

    def __init__(self, max_world_size=4):
        self.max_world_size = max_world_size
        self._context = mp.get_context("spawn")  # never fork a process that has torch's threads running
        self._workers, self._tasks, self._replies = [], [], None
        self._task_ids = itertools.count()

    def _grow(self, world_size):
        use_loopback_for_gloo()
        if self._replies is None:
            self._replies = self._context.Queue()
        while len(self._workers) < world_size:
            tasks = self._context.Queue()
            worker = self._context.Process(target=_worker, args=(len(self._workers), tasks, self._replies), daemon=True)
            worker.start()
            self._workers.append(worker)
            self._tasks.append(tasks)

    def run(self, fn, world_size, *args, timeout_s=60.0):
        """fn(rank, world_size, *args) on ranks 0..world_size-1, joined in a new gloo group; the results in
        rank order. fn must be defined at the top level of an importable module; args must pickle."""
        if not 1 <= world_size <= self.max_world_size:
            raise ValueError(f"world_size={world_size}: this pool runs 1 to {self.max_world_size} ranks.")
        self._grow(world_size)
        task_id, port = next(self._task_ids), free_port()
        for rank in range(world_size):
            self._tasks[rank].put((task_id, fn, world_size, port, args, timeout_s))
        replies, start, first_error, arrival = {}, time.monotonic(), None, []
        while len(replies) < world_size:
            now = time.monotonic()
            if now - start > timeout_s or (first_error is not None and now - first_error > 5.0):
                break  # out of time; or a rank failed and the others wait for it in a collective
            try:
                got_id, rank, status, payload = self._replies.get(timeout=0.2)
            except queue.Empty:
                if any(not self._workers[rank].is_alive() for rank in range(world_size) if rank not in replies):
                    break  # a process died (killed, or crashed in native code)
                continue
            if got_id == task_id:
                replies[rank] = (status, payload)
                arrival.append(rank)
                if status == "error" and first_error is None:
                    first_error = time.monotonic()
        missing = [rank for rank in range(world_size) if rank not in replies]
        died = {rank: self._workers[rank].exitcode for rank in missing if not self._workers[rank].is_alive()}
        if missing:
            self.close()  # stuck or dead processes: the next run starts new ones
        errors = {rank: payload for rank, (status, payload) in replies.items() if status == "error"}
        todo = next((e for e in errors.values() if e["todo"]), None)
        if todo is not None:
            raise TodoInRank(todo["message"])
        lost = "".join([f"; rank {rank}'s process died (exit code {code})" for rank, code in died.items()] +
                       [f"; rank {rank} never answered" for rank in missing if rank not in died])
        if errors:
            rank = first_failure(errors, arrival)
            error = errors[rank]
            echoes = sorted(r for r, e in errors.items() if r != rank and is_peer_lost(e))
            if echoes:
                lost += f"; then rank{'s' if len(echoes) > 1 else ''} {', '.join(map(str, echoes))} lost the connection to it (an echo of this error)"
            hint = f"\n{COLLECTIVES_HINT}" if missing or "gloo" in error["message"] else ""
            raise RankError(f"rank {rank} of {world_size} raised {error['type']}: {error['message']}{lost}{hint}\n"
                            f"{_short_traceback(error['traceback'])}")
        if missing:
            raise RankTimeout(f"ranks {missing} of {world_size} did not finish within {timeout_s:.0f} s{lost}. {COLLECTIVES_HINT}")
        return [pickle.loads(replies[rank][1]) for rank in range(world_size)]

    def close(self):
        for tasks, worker in zip(self._tasks, self._workers):
            if worker.is_alive():
                tasks.put(None)
        for worker in self._workers:
            worker.join(timeout=2)
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._workers, self._tasks, self._replies = [], [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------------------------
# Watching the communication

@dataclass
class Collective:
    op: str  # e.g. "ProcessGroup.allreduce" or "_c10d_functional::all_reduce"
    numel: int  # numbers in the tensors it carries
    nbytes: int

    @property
    def is_all_reduce(self):
        return "allreduce" in self.op or "all_reduce" in self.op


class _FunctionalCollectives(TorchFunctionMode):
    """Records the calls of torch.ops._c10d_functional.* (what torch.distributed._functional_collectives runs)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload):
            name = func.name()
        else:  # an OpOverloadPacket (torch.ops.ns.op), or an ordinary torch function
            name = getattr(func, "_qualified_op_name", "")
        if name.startswith("_c10d_functional::") and not name.split("::")[1].startswith(("wait", "_wrap")):
            self.log.record(name, args, kwargs)
        return func(*args, **kwargs)


class CollectiveLog:
    """Inside `with CollectiveLog() as log:`, log.calls lists every collective operation run, in order.

    Two doors, which every collective of torch.distributed passes through one of: a process group's own
    methods (dist.all_reduce and friends call group.allreduce(...); so may a user), patched here for the
    duration, and torch's functional collectives (torch.ops._c10d_functional.*), which a torch-function
    mode sees. (A dispatch mode would see both at once, but its first use imports torch._dynamo: a second
    of CPU in every process.)"""

    METHODS = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_into_tensor_coalesced",
               "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "broadcast", "reduce")

    def __init__(self):
        self.calls = []

    def record(self, op, args, kwargs):
        tensors = [t for t in _pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        self.calls.append(Collective(op, sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)))

    def __enter__(self):
        # The class's own entries (pybind's instancemethod objects), put back as they were on exit.
        self._originals = {name: vars(dist.ProcessGroup)[name] for name in self.METHODS if name in vars(dist.ProcessGroup)}
        for name in self._originals:
            setattr(dist.ProcessGroup, name, self._counting(name, getattr(dist.ProcessGroup, name)))
        self._mode = _FunctionalCollectives(self)
        self._mode.__enter__()
        return self

    def _counting(self, name, original):
        def counted(group, *args, **kwargs):
            self.record(f"ProcessGroup.{name}", args, kwargs)
            return original(group, *args, **kwargs)
        return counted

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for name, original in self._originals.items():
            setattr(dist.ProcessGroup, name, original)

    @property
    def all_reduces(self):
        return [c for c in self.calls if c.is_all_reduce]

    def summary(self):
        """e.g. "8 all-reduces" or "0 all-reduces (and 8 c10d::allgather_)"."""
        others = {}
        for c in self.calls:
            if not c.is_all_reduce:
                others[c.op] = others.get(c.op, 0) + 1
        extra = ", ".join(f"{n} {op}" for op, n in others.items())
        return f"{len(self.all_reduces)} all-reduces" + (f" (and {extra})" if extra else "")
