"""Device bugs caught on a CPU: a tensor made on the default device beside a model on another one.

On a GPU machine the model lives on "cuda" while `torch.tensor([...])`, `torch.arange(n)` and friends,
called without `device=`, make their tensors on the CPU; the first op that mixes the two raises. On a
CPU-only machine (CI) both are the CPU and the bug stays hidden. The audit brings it back: inside it,
every tensor knows which side it would be on,

- host: made by a factory without a device (`torch.tensor`, `arange`, `zeros`, `randint`, ...), by
  `torch.from_numpy`, by `.cpu()`;
- device: the weights of a model marked with on_device(model), what they compute, what `.cuda()` moved;
- either: everything else, e.g. made with an explicit `device=` or moved with `.to(device)` (on a CPU,
  `x.device` cannot tell the host from the model's device, so such a tensor goes with whatever it meets),

and an op's result is on the device if any input is, else on the host if any input is. An op that mixes a
host tensor of one or more dimensions with a device tensor raises DeviceMismatch, as CUDA would. What CUDA
accepts is accepted: a 0-dim host tensor (a CPU scalar), host indices into a device tensor, and copies
between the two (`copy_`, slice assignment).

An index out of range inside a torch op (an embedding of id 50257, a gather past a block table) raises an
IndexError or RuntimeError on a CPU, which the caller could catch and go on; on CUDA it is a device-side
assert that leaves the process's CUDA context unusable. The audit raises DeviceSideAssert there: ids,
positions and block ids must be checked on the host before any kernel.

    with DeviceAudit():
        ...  # code that must also run with the model on a GPU

`pytest exercises/ --device-audit` grades under it (tests/test_checkers.py runs the references so).
"""

import re

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode, _pop_mode_temporarily

SIDE = "_workshop_side"  # the attribute that says where a tensor would live
HOST, DEVICE, EITHER = "host", "device", None  # EITHER: no mark
FACTORIES = {torch.tensor, torch.as_tensor, torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.rand,
             torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.eye, torch.empty_strided,
             torch.tril_indices, torch.triu_indices, torch.from_numpy, torch.frombuffer}
ALWAYS_HOST = {torch.from_numpy, torch.frombuffer, torch.Tensor.cpu, torch.Tensor.numpy}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}  # an explicit move: to the model's device
CROSSING = {torch.Tensor.copy_, torch.Tensor.__setitem__}  # CUDA copies between devices here
INDEXING = {torch.Tensor.__getitem__}


class DeviceMismatch(RuntimeError):
    pass


class DeviceSideAssert(RuntimeError):
    """An index out of range inside a torch op: on CUDA a device-side assert, the end of the process's GPU work."""


# What torch's CPU kernels say of an index out of range ("index out of range in self", "index 9 is out of bounds
# for dimension 0 with size 5"); on CUDA the same kernels assert on the device instead.
_OUT_OF_RANGE = re.compile(r"index (-?\d+ )?(is )?out of (range|bounds)")


def side(tensor):
    return getattr(tensor, SIDE, EITHER)


def on_device(model):
    """Under an audit, mark a model's weights as living on the model's device (a copy.deepcopy of a model
    loses the marks: mark the copy too); returns the model."""
    if current() is not None:
        for tensor in [*model.parameters(), *model.buffers()]:
            _marked(tensor, DEVICE)
    return model


class DeviceAudit(TorchFunctionMode):
    """Raise where CUDA would: an op mixing a default-device (host) tensor with a model-device tensor."""

    def __init__(self):
        super().__init__()
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            result = func(*args, **kwargs)
        except (IndexError, RuntimeError) as e:
            if self.paused or isinstance(e, (DeviceMismatch, DeviceSideAssert)) or not _OUT_OF_RANGE.search(str(e)):
                raise
            raise DeviceSideAssert(
                f"{_name(func)} was given an index out of range ({e}): on a CPU an error, on a GPU a device-side assert "
                f"that ends the process's CUDA work. Check ids, positions and block ids on the host before any kernel, "
                f"with a ValueError that names the value and the limit.") from e
        if self.paused:
            return result
        if func is torch.Tensor.cpu:
            return _marked(_alias(result, args[0]), HOST)
        if func in ALWAYS_HOST:
            where = HOST
        elif func in FACTORIES and not (func is torch.as_tensor and isinstance(args[0], torch.Tensor)):
            where = HOST if kwargs.get("device") is None else EITHER
        elif func in MOVES:
            return _marked(_alias(result, args[0]), _destination(func, args, kwargs))
        else:
            where = self._check(func, args, kwargs)
        for tensor in _tensors(result):
            _marked(tensor, where)
        return result

    def _check(self, func, args, kwargs):
        """Where the result lives; raise if CUDA would refuse the op."""
        tensors = _tensors(args) + (_tensors(kwargs) if kwargs else [])
        if func in INDEXING:  # host indices into a device tensor are fine; device indices into a host one are not
            tensors = [args[0]] + ([t for t in tensors[1:] if side(t) == DEVICE] if side(args[0]) == HOST else [])
        sides = [side(t) for t in tensors]
        host = [t for t in tensors if side(t) == HOST and t.dim() > 0]
        device = [t for t in tensors if side(t) == DEVICE]
        if host and device and func not in CROSSING:
            raise DeviceMismatch(
                f"{_name(func)} mixes a tensor made on the default device (shape {tuple(host[0].shape)}) with one on the "
                f"model's device (shape {tuple(device[0].shape)}): on a GPU this raises 'Expected all tensors to be on the "
                f"same device'. Make the tensor where the model lives: pass device=model.device (or the input's .device) "
                f"to torch.tensor / torch.arange / torch.zeros..., or move it with .to(model.device).")
        return DEVICE if DEVICE in sides else HOST if HOST in sides else EITHER

    def pause(self):
        """Stop checking (inside a timed region: the checks cost Python time); a context manager."""
        return _Paused(self)


class _Paused:
    def __init__(self, audit):
        self.audit = audit

    def __enter__(self):
        self.was, self.audit.paused = self.audit.paused, True
        # Off the mode stack while paused when it is on top: even a paused mode costs a Python call per torch op.
        self.off_stack = _get_current_function_mode() is self.audit and _pop_mode_temporarily()
        if self.off_stack:
            self.off_stack.__enter__()

    def __exit__(self, *exc):
        if self.off_stack:
            self.off_stack.__exit__(None, None, None)
        self.audit.paused = self.was


def _tensors(value):
    """The tensors in a value: in lists, tuples (torch's named return types included) and dicts, two levels
    deep (what torch functions take: torch.cat's list, an index's tuple)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return []
    found = []
    for item in value:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found += [x for x in item if isinstance(x, torch.Tensor)]
    return found


def _marked(tensor, where):
    if where is EITHER:
        if hasattr(tensor, SIDE):
            delattr(tensor, SIDE)
    else:
        setattr(tensor, SIDE, where)
    return tensor


def _destination(func, args, kwargs):
    """Where .to(...) / .cuda() sends a tensor: .cuda() and .to(other_tensor) say so; .to(device) names a
    device that on a CPU may be either side; .to(dtype) stays where it was."""
    if func is torch.Tensor.cuda:
        return DEVICE
    targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
    if any(isinstance(t, torch.Tensor) for t in targets):
        return side(next(t for t in targets if isinstance(t, torch.Tensor)))
    if any(isinstance(t, (str, torch.device)) for t in targets):
        return EITHER
    return side(args[0])


def _alias(result, source):
    """On a CPU, .to(device) and .cpu() return their input itself: an alias, so that marking the moved
    tensor leaves the one it came from where it was."""
    return result.view(result.shape) if result is source else result


def _name(func):
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def current():
    """The DeviceAudit in force, or None."""
    from torch.overrides import _get_current_function_mode_stack

    return next((mode for mode in _get_current_function_mode_stack() if isinstance(mode, DeviceAudit)), None)


def paused():
    """A context in which the audit in force (if any) stops checking: timed regions."""
    audit = current()
    return audit.pause() if audit else _Paused(DeviceAudit())
