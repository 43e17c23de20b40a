"""Counting the times code reads a tensor's values on the host: on a GPU each one waits for every kernel
queued before it (a sync), so an engine step that makes one read lets the device run ahead until then.

    with HostReads() as reads:   # everything run inside is watched, on any device
        step()
    reads.count, reads.reads     # how many, and what each was ('tolist', 'aten.nonzero.default', ...)

A CPU has no queue to wait on, so this counts what WOULD sync on a GPU: a value read into Python
(.item(), int(t), float(t), bool(t), `if t:`, .tolist(), .numpy()) and the operations whose output's
shape depends on the values (nonzero, a boolean index x[mask], masked_select, unique, ...), which must
read them to size the result. Copies to the device are not reads (they need not wait).
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATen operations that read values on the host: a scalar out, or an output shaped by the values
READING_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "unique_consecutive", "equal",
               "is_nonzero", "bincount", "histc")
PYTHON_READS = ("tolist", "numpy", "__array__")  # the reads that do not go through an ATen operation


def _reads_values(func, args):
    name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
    if name in READING_OPS:
        return True
    if name == "index" and len(args) > 1:  # a boolean index x[mask]: its shape is the count of True
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
    return False


class HostReads(TorchDispatchMode):
    """A context manager: .reads lists every host read made inside it, .count how many."""

    def __init__(self):
        super().__init__()
        self.reads, self._originals = [], {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _reads_values(func, args):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in PYTHON_READS:
            original = self._originals[name] = getattr(torch.Tensor, name)

            def watched(tensor, *args, _name=name, _original=original, **kwargs):
                self.reads.append(_name)
                with torch.utils._python_dispatch._disable_current_modes():  # its own ops are not counted twice
                    return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, watched)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    @property
    def count(self):
        return len(self.reads)
