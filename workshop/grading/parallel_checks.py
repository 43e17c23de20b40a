"""What exercise 9's checker runs on every rank (workshop.distributed.ProcessPool runs these functions in
its processes; exercises/test_ex9_tensor_parallel.py judges what they return).

Each function gets the dotted name of the module under test (the student's exercises.ex9_tensor_parallel,
the reference, or a control of tests/), imports it in the rank's process, builds that rank's
ParallelGPT from the embedded tiny model and returns plain numbers and lists: the parent compares
them with the single-process model. Every rank runs exactly the same sequence of forwards, whatever
its own results, so that no rank waits in an all-reduce for a rank that went another way.
"""

import functools
import importlib
import itertools
import os
import sys
import time

import torch
import torch.distributed as dist

import gpt
from workshop.distributed import CollectiveLog
from workshop.grading.harness import paired_timing

TOLERANCE = 1e-4  # fp32 logits: a sharded model adds the same numbers in another order (about 1e-5 here)


@functools.cache
def load(name="tiny"):
    return gpt.load_model(name, device="cpu")


def implementation(module_name):
    return importlib.import_module(module_name)


def sharded(module_name, rank, world_size, model_name="tiny"):
    return implementation(module_name).ParallelGPT(load(model_name), rank, world_size)


def _positions(ids):
    return torch.arange(ids.shape[1]).expand(ids.shape[0], -1)


def _watch_parts(tp_model, model):
    """Forward hooks that record each block's attention and MLP output, in the sharded model (when it keeps
    gpt.py's layout, tp_model.h[i].attn and .mlp) and in the single-process one."""
    outputs, handles = {}, []
    for i, block in enumerate(model.transformer.h):
        ours = getattr(tp_model, "h", None)
        for part in ("attn", "mlp"):
            theirs = getattr(ours[i], part, None) if ours is not None and i < len(ours) else None
            if not isinstance(theirs, torch.nn.Module):
                continue
            for side, module in (("full", getattr(block, part)), ("tp", theirs)):
                def hook(module, args, output, key=(side, i, part)):
                    outputs.setdefault(key, output.detach().clone() if isinstance(output, torch.Tensor) else None)
                handles.append(module.register_forward_hook(hook))
    return outputs, handles


def _first_difference(outputs):
    """(block, part, error) of the first attention or MLP output that differs, or None."""
    for (side, i, part), full in sorted(outputs.items(), key=lambda kv: (kv[0][1], kv[0][2] != "attn")):
        if side != "full" or ("tp", i, part) not in outputs:
            continue
        tp = outputs["tp", i, part]
        if tp is None or tp.shape != full.shape:
            return i, part, float("inf")
        error = (tp - full).abs().max().item()
        if error > TOLERANCE:
            return i, part, error
    return None


@torch.no_grad()
def logits(rank, world_size, module_name, batches):
    """Each batch ([B, T] token ids) through the rank's sharded model and the single-process model: the
    error of the logits, the all-reduces of the forward, and the first attention/MLP output that differs."""
    model, tp_model = load(), sharded(module_name, rank, world_size)
    report = []
    for ids in batches:
        ids = torch.tensor(ids)
        outputs, handles = _watch_parts(tp_model, model)
        try:
            full = model(ids, _positions(ids))
            with CollectiveLog() as log:
                got = tp_model(ids, _positions(ids))
        finally:
            for handle in handles:
                handle.remove()
        same_shape = isinstance(got, torch.Tensor) and got.shape == full.shape
        report.append({"shape": tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__,
                       "error": (got - full).abs().max().item() if same_shape else float("inf"),
                       "all_reduce_numels": [c.numel for c in log.all_reduces], "collectives": log.summary(),
                       "first_difference": _first_difference(outputs)})
    return report


@torch.no_grad()
def chunked(rank, world_size, module_name, ids, bounds):
    """One sequence fed in chunks ids[:, bounds[i]:bounds[i+1]] through exercise 2's KVCache (the reference's):
    each chunk's logits error against the full forward, and what the cache holds at the end."""
    from solutions.ex2_kv_cache import KVCache

    model, tp_model = load(), sharded(module_name, rank, world_size)
    ids = torch.tensor(ids)
    full = model(ids, _positions(ids))
    cache, errors = KVCache(model.config.n_layer), []
    for start, end in itertools.pairwise(bounds):
        got = tp_model(ids[:, start:end], _positions(ids)[:, start:end], cache)
        ok = isinstance(got, torch.Tensor) and got.shape == full[:, start:end].shape
        errors.append((start, end, (got - full[:, start:end]).abs().max().item() if ok else float("inf")))
    keys = cache.keys[0]
    return {"errors": errors, "cached_shape": None if keys is None else tuple(keys.shape), "cached_len": len(cache)}


def greedy(rank, world_size, module_name, cases):
    """The student's generate on this rank for each (prompt, max_new_tokens, eos_token_id), with the sizes of
    the all-reduces it ran (one entry per all-reduce, in order)."""
    tp_model, impl = sharded(module_name, rank, world_size), implementation(module_name)
    report = []
    for prompt, n, eos in cases:
        with CollectiveLog() as log:
            tokens = impl.generate(tp_model, list(prompt), n, eos)
        report.append({"tokens": tokens, "all_reduce_numels": [c.numel for c in log.all_reduces], "collectives": log.summary()})
    return report


def timing(rank, world_size, module_name, reference_name, prompt, n, repeats):
    """generate's wall clock, the student's against the reference's, taking turns (every rank in step)."""
    ours, theirs = implementation(module_name), implementation(reference_name)
    tp_ours, tp_theirs = sharded(module_name, rank, world_size), sharded(reference_name, rank, world_size)
    result = paired_timing(lambda: ours.generate(tp_ours, prompt, n, -1), lambda: theirs.generate(tp_theirs, prompt, n, -1),
                           repeats=repeats)
    return {"seconds_a": result.seconds_a, "seconds_b": result.seconds_b}


# ----------------------------------------------------------------------------------------------
# For the student's own launch(): what each rank saw, and a rank that fails

def probe(rank, world_size, token):
    """Where this rank runs: its process, its torch.distributed group, its threads; and one all-reduce. Also the TCP
    port its group met at (the port of the group's store; None for a store of another kind, a file), and whether
    this process is a fork of the checker's (it then holds the checker's modules, which a new interpreter never
    imports)."""
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # a PrefixStore wraps the store the group met at
        store = store.underlying_store
    return {"rank": rank, "world_size": world_size, "group_rank": dist.get_rank(), "group_size": dist.get_world_size(),
            "backend": str(dist.get_backend()), "threads": torch.get_num_threads(), "sum": value.item(),
            "pid": os.getpid(), "parent_pid": os.getppid(), "token": token, "port": getattr(store, "port", None),
            "forked": any(name.endswith("test_ex9_tensor_parallel") for name in sys.modules)}


class DeliberateFailure(RuntimeError):
    pass


def fail_on_rank(rank, world_size, bad_rank, folder):
    """Rank bad_rank raises; the others stay busy (as ranks waiting for it in a collective would) until they are
    stopped. The failure is the ONLY error of the run, whatever the load: bad_rank raises only once every other
    rank has written `folder`/ready-<rank>, i.e. has left init_process_group and communicates no more. (Raising
    at once would race a slow peer still connecting to the group: that peer would then fail too, with a
    connection error, and a launcher could fairly report either.)"""
    if rank != bad_rank:
        with open(os.path.join(folder, f"ready-{rank}"), "w"):
            pass
        time.sleep(600)
        return rank
    others = [os.path.join(folder, f"ready-{r}") for r in range(world_size) if r != bad_rank]
    deadline = time.monotonic() + 120
    while not all(os.path.exists(path) for path in others) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise DeliberateFailure(f"rank {rank} fails on purpose (the checker's test of launch)")


def large_result(rank, world_size, n_bytes, seed, folder):
    """A result of n_bytes seeded bytes (several MB: far more than a pipe's buffer), as plain bytes, which go
    back through whatever channel the launcher uses (a tensor could travel by shared memory instead); writes
    `folder`/done-<rank> once the result is ready, so the checker can tell a launcher that deadlocks after
    the ranks' work from ranks that are only slow."""
    import random

    payload = random.Random(seed * 1000 + rank).randbytes(n_bytes)
    with open(os.path.join(folder, f"done-{rank}"), "w"):
        pass
    return {"rank": rank, "payload": payload}

