"""Where an engine's step goes: the model's forward, sampling, scheduling and the bookkeeping around them
(block tables, positions, slot mappings, packing the batch, outputs), and how many host reads each makes.

    with StepSplit(engine, module) as split:   # watches one engine of exercise 4, 5 or 11 (nothing else changes)
        engine.run(requests)
    split.record()                               # ms per step of each part, its share, host reads per step

Each part is the time inside the functions named below, less the time of any watched function they call
(pack() inside the forward is bookkeeping, not forward); bookkeeping is also whatever the step does
outside them. On a GPU every watched call synchronises first and last, so the device's work lands in
the part that queued it: run it apart from the throughput runs, which it slows. Host reads (a value
read on the host: a sync on a GPU, workshop.host_reads) are counted in a second run, since watching
every ATen operation slows a step far more than it costs.
"""

import time
from contextlib import ExitStack

from workshop.grading.harness import synchronize
from workshop.host_reads import HostReads

PARTS = ("forward", "sampling", "scheduling", "bookkeeping")


def watched_functions(engine, module):
    """{part: [(owner, attribute name)]} for an engine of exercise 4 (continuous), 5 (paged) or 11 (paged on
    graphs: exercise 5's step, its decode steps through DecodeGraphs), with overlap scheduling or without."""
    paged = getattr(module, "paged", None) or module  # exercise 11's module keeps exercise 5's as .paged
    if hasattr(paged, "PagedKVCache"):
        parts = {"scheduling": [(engine, "schedule")], "forward": [(engine, "run_model")], "sampling": [(paged, "sample")],
                 "bookkeeping": [(paged, "pack")]}
        if getattr(engine.cache, "decode_batch", None) is not None:  # the persistent decode batch's update: bookkeeping
            parts["bookkeeping"].append((engine.cache.decode_batch, "update"))
        if getattr(engine, "graphs", None) is not None:  # exercise 11: filling the static inputs is bookkeeping too
            parts["bookkeeping"].append((engine.graphs.inputs, "fill"))
        if getattr(engine, "overlap", False):  # overlap scheduling (workshop/serving/overlap.py) samples on the device; its
            parts["sampling"].append((engine, "sample_on_device"))  # read, a step later, is bookkeeping (resolve)
        return parts
    if hasattr(module, "RunningBatch"):  # exercise 4: prefill and decode each call the model, then the sampler
        return {"scheduling": [(engine, "schedule")], "forward": [(module, "forward")], "sampling": [(module, "sample")]}
    raise TypeError(f"{module.__name__}: not an engine of exercise 4, 5 or 11 (no RunningBatch, no PagedKVCache).")


class StepSplit:
    """Watches engine.step and the functions of watched_functions(engine, module) while in the `with` block.
    reads=True counts host reads per part instead of timing them."""

    def __init__(self, engine, module, reads=False):
        self.engine, self.module, self.counting = engine, module, reads
        self.device = engine.model.device
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.reads = dict.fromkeys(PARTS, 0)
        self.steps = 0
        self._stack = []  # [part, what the watched calls below it used] of the calls running now
        self._patches = ExitStack()
        self._host_reads = None

    def _watch(self, owner, name, part):
        original = getattr(owner, name)

        def watched(*args, **kwargs):
            return self._call(part, original, args, kwargs)

        own = name in vars(owner)  # a module's function, or an instance's own attribute: put it back afterwards
        setattr(owner, name, watched)
        restore = (lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name))  # else the class's shows again
        self._patches.callback(restore)

    def _meter(self):
        """What a part is charged: host reads made so far (counting), or the clock after the device's queue (timing)."""
        if self.counting:
            return self._host_reads.count
        synchronize(self.device)
        return time.perf_counter()

    def _call(self, part, fn, args, kwargs):
        """Run fn, charging its part what it used less what the watched calls inside it used (their own parts')."""
        start = self._meter()
        self._stack.append([part, 0])
        try:
            return fn(*args, **kwargs)
        finally:
            used = self._meter() - start
            _, inner = self._stack.pop()
            (self.reads if self.counting else self.seconds)[part] += used - inner
            if self._stack:
                self._stack[-1][1] += used

    def __enter__(self):
        for part, functions in watched_functions(self.engine, self.module).items():
            for owner, name in functions:
                self._watch(owner, name, part)
        step = self.engine.step

        def watched_step():
            steps = self.engine.stats.steps
            try:
                return self._call("bookkeeping", step, (), {})  # the step's own lines, outside the parts, are bookkeeping
            finally:
                self.steps += self.engine.stats.steps - steps

        self.engine.step = watched_step
        self._patches.callback(lambda: vars(self.engine).pop("step", None))
        if self.counting:
            self._host_reads = self._patches.enter_context(HostReads())
        return self

    def __exit__(self, *exc):
        self._patches.close()
        return False

    def record(self):
        """ms per step of each part and its share of the step (timing run), or host reads per step (counting run)."""
        steps = max(self.steps, 1)
        if self.counting:
            per_step = {part: self.reads[part] / steps for part in PARTS}
            return {"steps": self.steps, "host_reads_per_step": {**per_step, "total": sum(per_step.values())}}
        total = sum(self.seconds.values())
        return {"steps": self.steps, "ms_per_step": {part: 1e3 * self.seconds[part] / steps for part in PARTS},
                "step_ms": 1e3 * total / steps, "share": {part: self.seconds[part] / total if total else 0.0 for part in PARTS}}
