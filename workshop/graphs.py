"""Capturing a step once and replaying it (module 11's given code): CUDA graphs on a GPU, and a CPU stand-in
that keeps their rules, so that a step is developed and graded on a laptop.

A CUDA graph records the kernels one call launches, with their shapes and the addresses of every tensor
they read and write; replay launches them all again at once, with no Python in between. So a replay sees
new VALUES only where they were copied into the captured tensors, never a new tensor, a new shape or a
new branch of Python. Three things cannot be captured: reading a tensor's value on the host (`.item()`,
`.tolist()`, `if tensor:`), an op whose output shape depends on values (`nonzero`, a boolean index), and
host data copied in during capture.

    graph = new_graph(device)
    with warmup(device):            # run the step once or twice first: lazy initialisation stays out of the graph
        step()
    with capture(graph, pool):      # record
        out = step()
    ...copy new values into the step's input tensors...
    graph.replay()                  # out now holds the new result

On a CPU, `CPUGraph` records the ATen operations of the call with the tensors they read and wrote, and
replay runs those operations again on the same tensors, writing each result into the tensor the capture
returned: no Python of the step runs, so a value copied into a new tensor is never seen, and a branch
taken at capture is taken for ever, exactly as on a GPU. `trace(fn)` lists the kernels one call runs and
their shapes (the checker compares two calls), and both refuse what a CUDA capture refuses.
"""

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READ = {torch.ops.aten._local_scalar_dense.default}  # .item(), .tolist(), bool(t), int(t): the host waits for the value
VALUE_SHAPED = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default, torch.ops.aten.unique_consecutive.default,
                torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default, torch.ops.aten.repeat_interleave.Tensor}


HOST_READ_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.item}  # read in C++, below the dispatcher
INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
            torch.ops.aten._index_put_impl_.default}


CAPTURES = []  # every capture so far, (graph, the pool it was given): the checker of exercise 11 reads it
_capturing = []  # the graph being captured now, if any


def capturing():
    """The graph being captured at this moment, or None."""
    return _capturing[-1] if _capturing else None


class NotCapturable(RuntimeError):
    """What a CUDA graph capture refuses, seen on any device."""


def _check(func, args=()):
    if func in INDEXING and any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in args[1]):
        func = torch.ops.aten.nonzero.default  # a boolean index: CUDA runs nonzero to find the selected positions
    if func in HOST_READ or func in HOST_READ_METHODS:
        raise NotCapturable("the step reads a tensor's value on the host (.item(), .tolist(), int(t), or a Python `if` "
                            "on a tensor): a graph has no host to read it, and the value would be the capture's for ever. "
                            "Keep every decision on the device (torch.where, masks) or take it before the step.")
    if func in VALUE_SHAPED:
        raise NotCapturable(f"the step runs {func.__name__}, whose output shape depends on the values (a boolean index "
                            f"such as x[mask] runs nonzero): a graph replays fixed shapes. Keep the shape and mask "
                            f"instead (torch.where, masked_fill, an attention mask).")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


class _NoHostReads(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        _check(func)
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check(func, args)
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class CPUGraph:
    """A CUDA graph's stand-in on a CPU: capture() records the operations, replay() reruns them on the
    same tensors. pool() returns a handle as torch.cuda.CUDAGraph.pool() does (a CPU has no pool to share)."""

    def __init__(self):
        self.ops = None  # None until captured
        self.replays = 0

    def replay(self):
        if self.ops is None:
            raise RuntimeError("replay() of a graph that was never captured: capture it first (with capture(graph)).")
        with torch.no_grad():
            self._replay()
        self.replays += 1

    def _replay(self):
        for func, args, kwargs, out in self.ops:
            result = func(*args, **kwargs)
            inputs = {_storage(t) for t in _tensors(args) + _tensors(list(kwargs.values()))}
            for kept, new in zip(_tensors(out), _tensors(result)):
                if _storage(kept) not in inputs:  # a view of an input, or an op in place: already written
                    kept.copy_(new)

    def pool(self):
        return ("cpu-pool", id(self))


def new_graph(device):
    """An empty graph for a step on `device`: torch.cuda.CUDAGraph on CUDA, CPUGraph elsewhere."""
    return torch.cuda.CUDAGraph() if torch.device(device).type == "cuda" else CPUGraph()


@contextlib.contextmanager
def warmup(device):
    """Where to run a step before capturing it: a side stream on CUDA (as torch.cuda.graph's own docs do),
    so that what the first calls set up (cuBLAS workspaces, allocator blocks) is not captured; no-op on a CPU."""
    if torch.device(device).type != "cuda":
        yield
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


@contextlib.contextmanager
def capture(graph, pool=None):
    """Record what runs inside into `graph`. pool: another graph's pool() (graph.pool()), so that the graphs of
    every size share one memory pool (only one of them replays at a time)."""
    CAPTURES.append((graph, pool))
    _capturing.append(graph)
    try:
        if isinstance(graph, CPUGraph):
            graph.ops = []
            with torch.no_grad(), _NoHostReads(), _Recorder(graph.ops):
                yield
        else:
            with torch.cuda.graph(graph, pool=pool):
                yield
    finally:
        _capturing.pop()


class _Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check(func, args)
        out = func(*args, **kwargs)
        self.kernels.append((str(func), tuple(tuple(t.shape) for t in _tensors(out))))
        return out


def trace(fn, *args, **kwargs):
    """Run fn once and return (its result, the ATen operations it ran as [(op, output shapes)]: on a GPU each launches
    a kernel, but the views among them, which launch nothing). Raises NotCapturable
    where a capture would fail. A step is capturable for one batch size when every call at that size runs the
    same kernels with the same shapes, whatever values its inputs hold."""
    tracer = _Tracer()
    with _NoHostReads(), tracer:
        result = fn(*args, **kwargs)
    return result, tracer.kernels
