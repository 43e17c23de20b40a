"""Checker for exercise 9, tensor parallelism: pytest exercises/test_ex9_tensor_parallel.py (-k 9a, 9b, 9c, 9d)

Parts 9b and 9c run your code in several processes joined by torch.distributed (gloo), one per rank, and
compare what every rank computed with the single-process model. The processes are the checker's own
(workshop/distributed.py), so these parts do not depend on your launch() of part 9d. An exception on a
rank is reported here with that rank's traceback; ranks that wait for each other forever are stopped
after a time limit and reported as such; when one rank's failure makes another lose its connection, the
first rank's own error is the one reported.

Part 9d runs your launch(): every rank in a new process of its own and in one gloo group, results of several
MB each back whole and in rank order (a launch that joins the ranks before reading their results deadlocks,
and is reported as a deadlock), and a failing rank's own error raised.
"""

import multiprocessing
import os
import random
import socket
import threading
import time

import pytest
import torch

import solutions.ex2_kv_cache as ex2
from workshop.grading import parallel_checks
from workshop.distributed import ProcessPool, use_loopback_for_gloo
from workshop.grading.harness import PairedTiming, compare_tokens, implementation, refused
from workshop.serving.workloads import sample_prompts, with_eos_inside
import copy
import dataclasses
import importlib
from hypothesis import strategies as st
import gpt
from workshop.distributed import CollectiveLog
from workshop.grading.differential import GreedyTokens, Tolerance, Twins, explore
from workshop.grading.scenarios import around, prompts, small_config, small_model, token_ids
import solutions.ex9_tensor_parallel as reference

HINTS = "exercises/hints/ex9.md"
REFERENCE = "solutions.ex9_tensor_parallel"
TOLERANCE = parallel_checks.TOLERANCE
SHARDED = ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight")
ROW_BIASES = ("attn.c_proj.bias", "mlp.c_proj.bias")  # held by one rank, or by all and added after the sum: both fine
PARTS_HINT = (f"Check, in this order (see {HINTS}, 9a and 9b): q, k and v of the SAME heads on a rank; an all-reduce after "
              f"each row-parallel c_proj (attention's and the MLP's); a row-parallel layer's bias added ONCE in the sum, "
              f"not once per rank; c_attn and c_fc column-parallel (split their outputs), both c_proj row-parallel (split "
              f"their inputs).")


@pytest.fixture(scope="module")
def student():
    return implementation("ex9_tensor_parallel")


@pytest.fixture(scope="module")
def pool():
    with ProcessPool(max_world_size=4) as pool:
        yield pool


def on_ranks(pool, student, check, world_size, *args, timeout_s=60):
    """parallel_checks.<check>(rank, world_size, <your module>, *args) on every rank; the results in rank order."""
    return pool.run(check, world_size, student.__name__, *args, timeout_s=timeout_s)


# ----------------------------------------------------------------------------------------------
# 9a: sharding (in this process: building a rank's share communicates nothing)

def model_shares(model):
    """Numbers in the model's replicated weights, in its sharded ones, and in the two row-parallel biases."""
    replicated = sharded = row_biases = 0
    for name, p in model.named_parameters():  # the tied lm_head counts once
        if name.endswith(SHARDED):
            sharded += p.numel()
        elif name.endswith(ROW_BIASES):
            row_biases += p.numel()
        else:
            replicated += p.numel()
    return replicated, sharded, row_biases


def held(shard):
    """(numbers in the shard's parameters and buffers, numbers their storage holds: a view keeps its whole tensor)."""
    tensors = list(shard.parameters()) + list(shard.buffers())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size() for t in tensors}
    return sum(t.numel() for t in tensors), sum(storages.values())


def largest(shard, n=6):
    named = sorted(shard.named_parameters(), key=lambda kv: -kv[1].numel())
    return ", ".join(f"{name} {list(p.shape)}" for name, p in named[:n])


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_9a_each_rank_holds_its_share(student, model, world_size):
    """Every rank holds the replicated weights whole and exactly 1/W of each block's matrices (counted)."""
    replicated, sharded, row_biases = model_shares(model)
    low = replicated + sharded // world_size
    high = low + row_biases
    before = {name: p.clone() for name, p in model.named_parameters()}
    for rank in range(world_size):
        shard = student.ParallelGPT(model, rank, world_size)
        elements, stored = held(shard)
        where = (f"rank {rank} of {world_size} (the tiny model: {replicated:,} numbers replicated, {sharded:,} in the blocks' "
                 f"matrices and column-parallel biases, of which a rank holds 1/{world_size}, and {row_biases:,} in the row-"
                 f"parallel biases, which one rank or all may hold)")
        assert elements >= low, (
            f"{where} holds {elements:,} numbers as parameters and buffers, fewer than the {low:,} its share needs: keep every "
            f"weight a parameter (nn.Linear does) or a registered buffer, so that the rank's memory can be counted "
            f"(see {HINTS}, 9a: ParallelAttention.__init__, hint 2).")
        assert elements <= high, (
            f"{where} holds {elements:,} numbers, but its share is {low:,} (+ up to {row_biases:,} for the row-parallel "
            f"biases): it keeps more than 1/{world_size} of the sharded weights. Its largest tensors: {largest(shard)} "
            f"(see {HINTS}, 9a: ParallelAttention.__init__, hint 2).")
        assert stored <= high, (
            f"{where} has the right parameter sizes ({elements:,} numbers), but their storage holds {stored:,}: some are "
            f"views into the full model's weights (a slice such as weight[a:b] keeps the whole matrix alive), so the rank "
            f"still holds the full model. Copy the slices (see {HINTS}, 9a: ParallelAttention.__init__, hint 3).")
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert not changed, f"building the shards changed the model's own weights ({changed[:4]}): copy, never write into them."


def test_9a_bad_world_size_is_rejected(student, model):
    """A world size that does not divide n_head, or a rank outside 0..W-1, is a ValueError before any work."""
    n_head = model.config.n_head
    for rank, world_size in ((0, 3), (0, 8), (0, 0), (2, 2), (-1, 2)):
        with pytest.raises(ValueError) as error:
            student.ParallelGPT(model, rank, world_size)
        assert str(error.value), f"ParallelGPT(model, rank={rank}, world_size={world_size}) raised a ValueError without a message."
    with pytest.raises(ValueError) as error:
        student.ParallelGPT(model, 0, 3)
    assert str(n_head) in str(error.value), (
        f"the ValueError for world_size=3 should say what is wrong and what to do, with the model's number of heads "
        f"({n_head}: W must divide it); it says: {error.value}")


# ----------------------------------------------------------------------------------------------
# 9b: the forward, with one all-reduce after each row-parallel layer

@pytest.fixture(scope="module")
def batches(model, seed):
    """A sampled prompt (one row) and two rows of random tokens of a seeded length."""
    g = torch.Generator().manual_seed(seed)
    T = int(torch.randint(5, 40, (1,), generator=g))
    prompt = sample_prompts(model, 1, 8, 32, seed + 9)[0]
    return [[prompt], torch.randint(0, model.config.vocab_size, (2, T), generator=g).tolist()]


@pytest.fixture(scope="module")
def logits_runs(pool, student, batches):
    """parallel_checks.logits at each world size, run once and shared by the 9b checks (an error is re-raised)."""
    runs = {}

    def get(world_size):
        if world_size not in runs:
            try:
                runs[world_size] = on_ranks(pool, student, parallel_checks.logits, world_size, batches)
            except BaseException as error:  # noqa: BLE001 (re-raised by every check that asks)
                runs[world_size] = error
        if isinstance(runs[world_size], BaseException):
            raise runs[world_size]
        return runs[world_size]
    return get


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_9b_logits_match_single_process(model, batches, logits_runs, world_size):
    """Every rank's logits equal the single-process model's (fp32, tight tolerance)."""
    n_layer = model.config.n_layer
    for rank, report in enumerate(logits_runs(world_size)):
        for ids, run in zip(batches, report):
            shape = (len(ids), len(ids[0]), model.config.vocab_size)
            batch = f"a [{len(ids)}, {len(ids[0])}] batch"
            assert tuple(run["shape"]) == shape, f"with W={world_size}, rank {rank}'s forward on {batch} returned {run['shape']}, expected {shape}."
            if run["error"] <= TOLERANCE:
                continue
            where = run["first_difference"]
            first = (f" The first output that differs: block {where[0]}'s {'attention' if where[1] == 'attn' else 'MLP'}, by "
                     f"{where[2]:.3g}." if where else "")
            alone = (" With a single rank nothing is split: the forward itself is wrong." if world_size == 1 else "")
            raise AssertionError(f"with W={world_size}, rank {rank}'s logits on {batch} differ from the single-process model's "
                                 f"by {run['error']:.3g} (tolerance {TOLERANCE}).{first}{alone} The forward ran "
                                 f"{run['collectives']} ({2 * n_layer} expected: two per block).\n{PARTS_HINT}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_9b_two_all_reduces_per_block(model, batches, logits_runs, world_size):
    """A forward runs exactly 2 all-reduces per block (counted however they are called), each of the block's [B, T, C]."""
    n_layer, C = model.config.n_layer, model.config.n_embd
    for rank, report in enumerate(logits_runs(world_size)):
        for ids, run in zip(batches, report):
            numels, expected = run["all_reduce_numels"], len(ids) * len(ids[0]) * C
            assert len(numels) == 2 * n_layer, (
                f"with W={world_size}, rank {rank}'s forward over {n_layer} blocks ran {run['collectives']}; expected "
                f"{2 * n_layer}: one after attention's row-parallel c_proj and one after the MLP's, per block, and no other "
                f"(see {HINTS}, 9b: ParallelAttention.forward, hint 1).")
            wrong = sorted({n for n in numels if n != expected})
            assert not wrong, (
                f"with W={world_size}, rank {rank}'s all-reduces on a [{len(ids)}, {len(ids[0])}] batch carry {wrong} numbers; "
                f"each should carry the row-parallel layer's partial output, [B, T, C] = {expected} numbers "
                f"(see {HINTS}, 9b: ParallelAttention.forward, hint 2).")


# ----------------------------------------------------------------------------------------------
# 9c: the KV cache per rank, greedy generation

def test_9c_cache_holds_this_ranks_heads(pool, student, model, seed):
    """A sequence fed in chunks through exercise 2's KVCache (prefill, then several tokens, then one) gives the
    full forward's logits on every rank, and each rank's cache holds only its own n_head / W heads."""
    world_size, g = 2, torch.Generator().manual_seed(seed + 1)
    rng = random.Random(seed + 1)
    bounds = [0, rng.randint(4, 20)]
    bounds += [bounds[-1] + rng.randint(2, 9), bounds[-1] + 10, bounds[-1] + 11, bounds[-1] + 12]
    bounds = sorted(set(bounds))
    ids = torch.randint(0, model.config.vocab_size, (1, bounds[-1]), generator=g).tolist()
    heads = model.config.n_head // world_size
    for rank, run in enumerate(on_ranks(pool, student, parallel_checks.chunked, world_size, ids, bounds)):
        for start, end, error in run["errors"]:
            assert error <= TOLERANCE, (
                f"with W={world_size}, rank {rank}'s logits of positions {start}..{end - 1}, fed after {start} cached ones, "
                f"differ from the full forward by {error:.3g}: the new keys and values go into kv_cache (this rank's heads), "
                f"and the queries attend over all of them (see {HINTS}, 9b: ParallelAttention.forward, hint 2).")
        shape = run["cached_shape"]
        assert shape is not None and shape[1] == heads and run["cached_len"] == bounds[-1], (
            f"with W={world_size}, rank {rank}'s KV cache holds keys of shape {shape} ({run['cached_len']} positions) after "
            f"{bounds[-1]} tokens; expected [1, {heads}, {bounds[-1]}, head_dim]: each rank caches only its own "
            f"n_head / W = {heads} heads (see {HINTS}, 9b: ParallelAttention.forward, hint 2).")


@pytest.fixture(scope="module")
def cases(model, seed):
    """Seeded prompts (half with GPT-2's <|endoftext|> inside), each with its own number of new tokens."""
    rng = random.Random(seed + 5)
    prompts = with_eos_inside(sample_prompts(model, 3, 1, 30, seed + 5), seed + 5)
    return [(prompt, rng.randint(4, 24), ex2.EOS_TOKEN_ID) for prompt in prompts]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_9c_greedy_matches_single_process(pool, student, model, tokenizer, cases, world_size):
    """Every rank returns the same tokens, those of exercise 2's generate on the whole model."""
    if world_size == 4:  # four processes on a 2-core machine take turns at every all-reduce: one short case
        cases = [(prompt, min(n, 8), eos) for prompt, n, eos in cases[:1]]
    runs = on_ranks(pool, student, parallel_checks.greedy, world_size, cases)
    for i, (prompt, n, eos) in enumerate(cases):
        tokens = [run[i]["tokens"] for run in runs]
        assert all(t == tokens[0] for t in tokens), (
            f"with W={world_size}, the ranks returned different tokens for the same prompt: {tokens}. Every rank computes "
            f"the same logits and takes the same argmax, and all stop at the same step (see {HINTS}, 9c: generate, hint 1).")
        problem = compare_tokens(tokens[0], ex2.generate(model, prompt, n, eos), model, prompt, tokenizer)
        assert problem is None, (f"with W={world_size}, generate(max_new_tokens={n}) differs from exercise 2's generate on "
                                 f"the whole model.\n{problem}\n(see {HINTS}, 9c: generate, hint 2)")


def test_9c_one_token_per_decode_step(pool, student, model, seed):
    """The prompt goes through the model once, then one token per forward, and no forward after the EOS: counted
    from the all-reduces (2 per forward, each of the forward's tokens x C numbers)."""
    world_size, n_layer, C = 2, model.config.n_layer, model.config.n_embd
    rng = random.Random(seed + 6)
    cases = []
    for prompt in sample_prompts(model, 2, 3, 24, seed + 6):
        free_run = ex2.generate(model, prompt, 16, eos_token_id=-1)
        eos = free_run[rng.randrange(3, 16)]
        cases.append((prompt, 16, eos))
    runs = on_ranks(pool, student, parallel_checks.greedy, world_size, cases)
    for rank, run in enumerate(runs):
        for (prompt, n, eos), got in zip(cases, run):
            numels = got["all_reduce_numels"]
            expected = ex2.generate(model, prompt, n, eos)
            assert got["tokens"] == expected, (
                f"with eos_token_id={eos}, rank {rank} returned {got['tokens']}, expected {expected}: stop right after the "
                f"model produces the EOS, and return it (see {HINTS}, 9c: generate, hint 1).")
            assert len(numels) % (2 * n_layer) == 0 and numels, (
                f"rank {rank}'s generate ran {got['collectives']}, not a multiple of 2 per block ({2 * n_layer} per forward).")
            passes = len(numels) // (2 * n_layer)
            positions = sum(numels[::2 * n_layer]) // C
            want = len(prompt) + len(expected) - 1
            assert (passes, positions) == (len(expected), want), (
                f"for a {len(prompt)}-token prompt and {len(expected)} new tokens (the last one the EOS), expected "
                f"{len(expected)} forward passes pushing {want} token positions (the prompt once, then one token per step, none "
                f"after the EOS); rank {rank} ran {passes} passes pushing {positions} (see {HINTS}, 9c: generate, hint 2).")

class NoForward:
    """A stand-in for a rank's ParallelGPT whose forward must never run (it fails the check if it does)."""

    def __init__(self, model):
        self.config, self.device, self.forwards = model.config, torch.device("cpu"), 0

    def __call__(self, *args, **kwargs):
        self.forwards += 1
        raise AssertionError("generate ran a forward of the model for a request check_request refuses: check the request "
                             f"first (see {HINTS}, 9c: generate).")


def test_9c_generate_checks_the_request_first(student, model):
    """A request that cannot run (max_new_tokens below 1, an empty prompt, more positions than the model has) is a
    ValueError from check_request before any forward: no rank starts an all-reduce the others would not."""
    prompt = list(range(5))
    for prompt_ids, n, why in ((prompt, 0, "max_new_tokens=0"), (prompt, -1, "max_new_tokens=-1"), ([], 3, "an empty prompt"),
                               (prompt, model.config.n_positions, "prompt + max_new_tokens past the context")):
        tp_model = NoForward(model)
        with refused(ValueError, f"generate with {why}"):
            student.generate(tp_model, prompt_ids, n)
        assert tp_model.forwards == 0, f"generate with {why} ran {tp_model.forwards} forwards before refusing the request."


@pytest.mark.timing
def test_9c_speed_against_reference(pool, student, model, tokenizer, cases):
    """With W = 2, your generate against the reference's, on the same ranks, taking turns."""
    prompt = cases[0][0]
    got = on_ranks(pool, student, parallel_checks.greedy, 2, [(prompt, 16, -1)])[0][0]["tokens"]
    problem = compare_tokens(got, ex2.generate(model, prompt, 16, -1), model, prompt, tokenizer)
    assert problem is None, f"correctness first: see the other checks.\n{problem}"
    runs = on_ranks(pool, student, parallel_checks.timing, 2, REFERENCE, prompt, 16, 3, timeout_s=180)
    timing = PairedTiming(runs[0]["seconds_a"], runs[0]["seconds_b"])
    assert timing.ratio < 2.0, (f"your tensor-parallel generate takes {timing.ratio:.2f}x the reference's time (limit 2x), "
                                f"rank 0:\n{timing.report('yours', 'reference')}")


# ----------------------------------------------------------------------------------------------
# 9d: launching, with your launch()

def call_with_timeout(fn, timeout_s):
    """fn() in a thread: ("ok", value), ("error", exception), or ("timeout", None); processes that fn started
    and left running are stopped."""
    before = set(multiprocessing.active_children())
    outcome = {}

    def target():
        try:
            outcome["ok"] = fn()
        except BaseException as error:  # noqa: BLE001 (judged by the caller)
            outcome["error"] = error
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    for process in set(multiprocessing.active_children()) - before:
        process.kill()
    if thread.is_alive():
        thread.join(5)
        return "timeout", None
    if "error" in outcome:
        if isinstance(outcome["error"], NotImplementedError):
            raise outcome["error"]
        return "error", outcome["error"]
    return "ok", outcome["ok"]


OTHER_BACKEND = "cpu:gloo"  # gloo, named for the CPU: a backend string other than launch's default


def test_9d_launch_runs_every_rank(student, seed):
    """launch(fn, 2, token) runs fn(rank, 2, token) in two new processes (spawned, not forked) joined by a gloo group,
    one thread each, and returns their results in rank order. Then two runs share the machine: the checker listens
    on the port the first run's ranks met at, as another run or program would, and a second launch (given
    backend=OTHER_BACKEND, which its groups must run) must still work, at another port: a free port for each
    launch, never one fixed port."""
    use_loopback_for_gloo()
    world_size, token = 2, seed * 31 + 7
    status, value = call_with_timeout(lambda: student.launch(parallel_checks.probe, world_size, token), 120)
    assert status != "timeout", f"launch(fn, {world_size}, ...) did not return within 120 s (see {HINTS}, 9d: launch, hint 2)."
    assert status == "ok", f"launch(fn, {world_size}, ...) raised {type(value).__name__}: {value}"
    assert isinstance(value, list) and len(value) == world_size, (
        f"launch should return a list of the {world_size} ranks' results, in rank order; got {str(value)[:300]}")
    for rank, seen in enumerate(value):
        assert isinstance(seen, dict) and seen.get("rank") == rank, (
            f"launch's result {rank} should be rank {rank}'s fn(...) result; got {str(seen)[:300]} (see {HINTS}, 9d: launch, hint 2).")
        assert (seen["group_rank"], seen["group_size"]) == (rank, world_size), (
            f"rank {rank}'s process group says it is rank {seen['group_rank']} of {seen['group_size']}: call "
            f"init_process_group with this process's rank and the world size before fn (see {HINTS}, 9d: launch, hint 2).")
        assert seen["backend"] == "gloo", f"rank {rank} runs the {seen['backend']!r} backend; on CPU use gloo."
        assert seen["threads"] == 1, (
            f"rank {rank} runs torch with {seen['threads']} threads: {world_size} processes share the machine's cores, so "
            f"each should use one thread (torch.set_num_threads(1)) (see {HINTS}, 9d: launch, hint 1).")
        assert seen["sum"] == world_size * (world_size + 1) / 2, f"an all-reduce across the ranks gave {seen['sum']}."
        assert seen["token"] == token, f"rank {rank}'s fn got {seen['token']} as its argument, expected {token}."
    pids = {seen["pid"] for seen in value}
    assert len(pids) == world_size and os.getpid() not in pids, (
        f"the ranks ran in processes {sorted(pids)} (this one is {os.getpid()}): each rank needs a new process of its own.")
    forked = [rank for rank, seen in enumerate(value) if seen["forked"]]
    assert not forked, (
        f"ranks {forked} run in a fork of the checker's process (they hold its modules): start each rank with the "
        f"\"spawn\" start method, a new interpreter; a fork of a process that runs torch's threads may deadlock "
        f"(see {HINTS}, 9d: launch, hint 1).")
    port = value[0]["port"]
    if port is None:  # the group met through something else than a TCP port (a file): no port to take
        return
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the first run's connections may linger (TIME_WAIT)
        taken.bind(("0.0.0.0", port))
        taken.listen()
        status, again = call_with_timeout(lambda: student.launch(parallel_checks.probe, world_size, token, backend=OTHER_BACKEND), 120)
    finally:
        taken.close()
    assert status == "ok", (
        f"the first launch's ranks met at port {port}. While another program listened there (as a second run would), a "
        f"second launch (backend={OTHER_BACKEND!r}) "
        + ("did not return within 120 s" if status == "timeout" else f"raised {type(again).__name__}: {str(again)[:500]}")
        + f"\nA launch that always meets at one fixed port works alone, and fails as soon as two runs share the machine: "
        f"pick a free port for each launch (the OS gives one: bind port 0, as free_port() does) (see {HINTS}, 9d: launch, hint 2).")
    assert isinstance(again, list) and len(again) == world_size and all(isinstance(seen, dict) for seen in again), (
        f"the second launch should return a list of the {world_size} ranks' results, in rank order; got {str(again)[:300]}")
    backends = [seen["backend"] for seen in again]
    assert all(b == OTHER_BACKEND for b in backends), (
        f"launch(fn, {world_size}, ..., backend={OTHER_BACKEND!r}): the ranks' groups run {backends}: init_process_group(backend) "
        f"with the backend launch was given, not a fixed one (see {HINTS}, 9d: launch, hint 2).")
    assert again[0]["port"] != port and [seen["sum"] for seen in again] == [3.0] * world_size, (
        f"the second launch's ranks report {str(again)[:300]}: they should meet at another port than {port} (taken), in "
        f"a group of their own.")


def test_9d_launch_reports_a_failing_rank(student, tmp_path):
    """When a rank raises, launch raises too, with that rank's error, and soon: it stops the other rank, which
    would otherwise wait for the failed one (here it sleeps for minutes). Rank 1's error is the run's only one:
    it raises once rank 0 has joined the group and communicates no more, so the verdict does not depend on load."""
    use_loopback_for_gloo()
    status, value = call_with_timeout(lambda: student.launch(parallel_checks.fail_on_rank, 2, 1, str(tmp_path)), 90)
    assert status != "timeout", (f"rank 1 raised, but launch had not returned after 90 s: when a rank fails, stop the "
                                 f"others (they may wait for it forever) and raise (see {HINTS}, 9d: launch, hint 2).")
    assert status == "error", f"rank 1 raised, but launch returned {str(value)[:300]} instead of raising."
    assert "fails on purpose" in str(value), (
        f"launch raised {type(value).__name__}: {str(value)[:500]}\nbut not with rank 1's error (\"rank 1 fails on purpose\"), "
        f"the only error of this run (rank 0 was sleeping): say which rank failed and why, with its own exception "
        f"(see {HINTS}, 9d: launch, hint 2).")


def test_9d_launch_refuses_world_size_below_one(student):
    """launch(fn, 0) or launch(fn, -1): a ValueError, at once (no process to start, nothing to wait for)."""
    for world_size in (0, -1):
        status, value = call_with_timeout(lambda: student.launch(parallel_checks.probe, world_size, 0), 30)
        assert status == "error" and isinstance(value, ValueError), (
            f"launch(fn, {world_size}, ...) " + ("did not return within 30 s" if status == "timeout" else
                                                  f"returned {str(value)[:200]}" if status == "ok" else
                                                  f"raised {type(value).__name__}: {str(value)[:300]}")
            + f": a world size below 1 is a ValueError (see {HINTS}, 9d: launch).")


LARGE = 4 << 20  # bytes per rank's result: 64 times a Linux pipe's buffer (64 KiB)
SETTLE_S = 20  # once every rank's result is ready, launch must return within this


def test_9d_launch_returns_large_results(student, seed, tmp_path):
    """Results of several MB each come back whole, in rank order, and launch returns soon after the ranks finish:
    a result larger than a pipe's buffer blocks its process until the parent reads it, so a launch that waits
    for (joins) the ranks before reading their results waits forever."""
    use_loopback_for_gloo()
    world_size, box = 2, {}

    def run():
        try:
            box["ok"] = student.launch(parallel_checks.large_result, world_size, LARGE, seed, str(tmp_path))
        except BaseException as error:  # noqa: BLE001 (judged below)
            box["error"] = error
    before = set(multiprocessing.active_children())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready_at, deadline = None, time.monotonic() + 180
    while thread.is_alive() and time.monotonic() < deadline:
        if ready_at is None and all((tmp_path / f"done-{rank}").exists() for rank in range(world_size)):
            ready_at = time.monotonic()
        if ready_at is not None and time.monotonic() - ready_at > SETTLE_S:
            break
        thread.join(0.1)
    stuck = thread.is_alive()
    for process in set(multiprocessing.active_children()) - before:
        process.kill()
    mb = LARGE / 2**20
    assert not stuck or ready_at is None, (
        f"deadlock: both ranks had their {mb:.0f} MB results ready, but launch had not returned {SETTLE_S} s later. A process "
        f"that writes more than a pipe's buffer (64 KiB) into a queue or pipe cannot finish until someone reads it, so "
        f"a launch that joins (waits for) the ranks before reading their results waits forever; read the results while "
        f"the ranks run, then join them (see {HINTS}, 9d: launch, hint 2).")
    assert not stuck, (f"launch(fn, {world_size}, ...) had not returned after 180 s, and the ranks never finished fn "
                       f"(each returns {mb:.0f} MB of bytes): were they started and joined in a group? (see {HINTS}, 9d: launch, hint 2).")
    if isinstance(box.get("error"), NotImplementedError):
        raise box["error"]
    assert "error" not in box, f"launch(fn, {world_size}, ...) raised {type(box['error']).__name__}: {str(box['error'])[:500]}"
    value = box["ok"]
    assert isinstance(value, list) and len(value) == world_size, (
        f"launch should return a list of the {world_size} ranks' results, in rank order; got {type(value).__name__} "
        f"of length {len(value) if hasattr(value, '__len__') else '?'}.")
    for rank, got in enumerate(value):
        expected = random.Random(seed * 1000 + rank).randbytes(LARGE)
        payload = got.get("payload") if isinstance(got, dict) else None
        assert isinstance(got, dict) and got.get("rank") == rank, f"launch's result {rank} should be rank {rank}'s, got rank {got.get('rank') if isinstance(got, dict) else got!r}."
        if payload != expected:
            where = next((i for i, (a, b) in enumerate(zip(payload or b"", expected)) if a != b), min(len(payload or b""), len(expected)))
            raise AssertionError(f"rank {rank}'s {mb:.0f} MB result came back altered: {len(payload or b''):,} bytes, first "
                                 f"difference at byte {where:,}; send each result whole (see {HINTS}, 9d: launch, hint 2).")


# ----------------------------------------------------------------------------------------------
# Differential checks: the reference is the oracle, on generated scenarios (workshop/grading/differential.py)
#
# Which heads and hidden units a rank owns, how it stores them (nn.Linear or buffers) and which rank adds a row-parallel
# bias are free choices (tests/alternatives/ex9_strided_heads.py makes others than the reference), so the observers
# read what every design promises: the numbers a rank holds against its share, views of the model's weights, storage
# shared with the model, the dtypes held, the errors; across processes, each rank's logits (within TOLERANCE), the
# sizes of its all-reduces, its KV cache's shape, and the tokens generate returns.





PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "9a": ["ParallelAttention.__init__", "ParallelMLP.__init__"],
    "9b": ["ParallelAttention.forward", "ParallelMLP.forward"],
    "9c": ["generate"],
    "9d": ["launch"],
}
DIFFERENTIAL_API = {  # each public name of the stub -> the check that runs it against the reference
    "linear_from": "test_differential_9a", "ParallelAttention": "test_differential_9a", "ParallelMLP": "test_differential_9a",
    "ParallelBlock": "test_differential_9a", "ParallelGPT": "test_differential_9a", "ParallelGPT.device": "test_differential_9a",
    "ParallelAttention.forward": "test_differential_9b", "ParallelMLP.forward": "test_differential_9b",
    "ParallelBlock.forward": "test_differential_9b", "ParallelGPT.forward": "test_differential_9b",
    "generate": "test_differential_9c",
    "launch": "test_differential_9d", "free_port": "test_differential_9d", "generate_on_rank": "test_differential_9d",
    "main": "test_differential_9d",
}
DIFF_TOLERANCE = Tolerance(rtol=0.0, atol=TOLERANCE)  # fp32 logits summed over the ranks in another order
COLUMNS = 48  # logits compared at this many vocabulary columns (and each position's largest): small enough to send back


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a call promises, as the observer reads it (`promised`); the value returned rides along in `_raw`, unread,
    so that the harness still sees whether it shares storage with an argument."""
    promised: object
    _raw: object = None


def storage_of(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


def read_shard(shard, source, world_size, sharded, row_biases):
    """A rank's share of `source` (an attention, an MLP, a block or a model) as every design promises it: the numbers
    it holds against its share (the replicated ones whole, 1/W of the sharded ones, a row-parallel bias on one rank or
    all), views of the model's weights (storage beyond the tensors), storage shared with the model's sharded weights
    (copies, even at W = 1), and the dtypes held."""
    params = dict(source.named_parameters())
    n_sharded = sum(p.numel() for n, p in params.items() if n.endswith(sharded))
    n_biases = sum(p.numel() for n, p in params.items() if n.endswith(row_biases))
    replicated = sum(p.numel() for p in params.values()) - n_sharded - n_biases
    low = replicated + n_sharded // world_size
    elements, stored = held(shard)
    tensors = list(shard.parameters()) + list(shard.buffers())
    share = "its share" if low <= elements <= low + n_biases else (
        f"{elements:,} numbers (its share: {low:,}, and up to {n_biases:,} of row-parallel biases)")
    model_sharded = storage_of([p for n, p in params.items() if n.endswith(sharded + row_biases)])
    return Seen({"holds": share, "storage beyond its tensors (views of the model's weights)": stored > low + n_biases,
                 "storage shared with the model's sharded weights": bool(storage_of(tensors) & model_sharded),
                 "dtypes held": sorted({str(t.dtype) for t in tensors})}, shard)


@st.composite
def scenarios_9a(draw):
    """A small random GPT-2 (1-4 heads: world sizes 1, 2, 3 and 4 divide some), in float32, float16 or bfloat16; pairs
    (rank, world_size) biased to the valid ones, with 0, a world size that does not divide n_head, ranks -1 and W;
    a slice of c_attn's weight (rows or columns: a view) with or without a bias for linear_from."""
    config = draw(small_config(max_layers=2))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]))
    pairs = []
    for _ in range(draw(st.integers(1, 4))):
        world_size = draw(st.one_of(st.sampled_from([w for w in (1, 2, 3, 4) if config.n_head % w == 0]), st.integers(0, 5)))
        pairs.append((draw(st.one_of(st.integers(0, max(world_size - 1, 0)), st.sampled_from([-1, world_size]))), world_size))
    rows = draw(st.booleans())
    return config, dtype, pairs, rows, draw(st.booleans())


def test_differential_9a(student, seed):
    """linear_from, ParallelAttention, ParallelMLP, ParallelBlock and ParallelGPT (and its device) against the
    reference, in this process (building a shard communicates nothing), on small random models whose head counts
    allow world sizes 1 to 4, in float32, float16 and bfloat16: the numbers each rank holds against its share, no
    views of the model's weights, no storage shared with them (copies even at W = 1), the dtypes held, the model
    unchanged, and a ValueError exactly where the reference raises one (W not dividing n_head, W = 0, a rank
    outside 0..W-1)."""
    def check(scenario):
        config, dtype, pairs, rows, bias = scenario
        model = small_model(config)
        block = copy.deepcopy(model.transformer.h[0]).to(dtype)  # the shared model stays float32
        twins = Twins(reference, student, hint=f"see {HINTS}, 9a: ParallelAttention.__init__ and ParallelMLP.__init__")
        where = f"a model with {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}"
        weight = block.attn.c_attn.weight.detach()
        piece = weight[: weight.shape[0] // 3] if rows else weight[:, 1:]
        b = block.attn.c_attn.bias.detach()[: piece.shape[0]] if bias else None
        twins.call(f"linear_from(c_attn.weight{'[:C]' if rows else '[:, 1:]'} {list(piece.shape)} {dtype}, bias={'a slice' if bias else None})",
                   lambda m, w, b: (lambda lin: Seen({"class": type(lin).__name__, "weight": lin.weight.detach(),
                                                      "bias": None if lin.bias is None else lin.bias.detach()}, lin))(m.linear_from(w, b)),
                   inputs=(piece, b))
        for rank, world_size in pairs:
            at = f"rank={rank}, world_size={world_size}"
            twins.call(f"ParallelAttention(h[0].attn of {where}, {dtype}; {at})",
                       lambda m, attn: read_shard(m.ParallelAttention(attn, rank, world_size), attn, world_size,
                                                  ("c_attn.weight", "c_attn.bias", "c_proj.weight"), ("c_proj.bias",)),
                       inputs=(block.attn,))
            if world_size >= 1 and config.n_head % world_size == 0 and 0 <= rank < world_size:  # the MLP's contract: a good W
                twins.call(f"ParallelMLP(h[0].mlp of {where}, {dtype}; {at})",
                           lambda m, mlp: read_shard(m.ParallelMLP(mlp, rank, world_size), mlp, world_size,
                                                     ("c_fc.weight", "c_fc.bias", "c_proj.weight"), ("c_proj.bias",)),
                           inputs=(block.mlp,))
            twins.call(f"ParallelBlock(h[0] of {where}, {dtype}; {at})",
                       lambda m, blk: read_shard(m.ParallelBlock(blk, rank, world_size), blk, world_size, SHARDED, ROW_BIASES),
                       inputs=(block,))
            twins.call(f"ParallelGPT({where}, float32; {at})",
                       lambda m, mdl: (lambda tp: Seen({**read_shard(tp, mdl, world_size, SHARDED, ROW_BIASES).promised,
                                                        "device": str(tp.device)}, tp))(m.ParallelGPT(mdl, rank, world_size)),
                       inputs=(model,))

    explore(scenarios_9a(), check, seed=seed, examples=25, name="scenario_9a", edges=EDGES_9A)


# Tried first at every seed (issue 41), one scenario (each builds every shard): four heads split over W = 4 (one head a
# rank) at ranks 0 and W - 1, then refused: W = 3 (does not divide 4), W = 0, rank W and rank -1; a slice of rows with
# its bias for linear_from. In float32.
EDGES_9A = [(gpt.GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=4), torch.float32, [(0, 4), (3, 4), (0, 3), (0, 0), (2, 2), (-1, 2)],
             True, True)]


def columns_of(logits, columns):
    """The logits at the chosen vocabulary columns, and each position's largest logit."""
    return {"shape": list(logits.shape), "columns": logits[..., columns].clone(), "largest": logits.max(dim=-1).values}


@torch.no_grad()
def differential_on_rank(rank, world_size, module_name, fields, columns, batches, sequence, bounds, cases):
    """On one rank (a process of the checker's pool): the reference's ParallelGPT and yours, built from the same small
    random model, each run through the same calls in the same order on every rank: plain forwards of `batches`, one
    sequence fed in chunks `bounds` through exercise 2's KVCache, and generate on `cases`. Returns both readings."""
    from solutions.ex2_kv_cache import KVCache

    model = small_model(gpt.GPTConfig(*fields))
    columns = torch.tensor(columns)
    readings = {}
    for side, name in (("reference", REFERENCE), ("yours", module_name)):
        impl = importlib.import_module(name)
        tp = impl.ParallelGPT(model, rank, world_size)
        seen = {"forwards": [], "chunks": [], "generate": []}
        for ids in batches:
            ids = torch.tensor(ids)
            with CollectiveLog() as log:
                logits = tp(ids, parallel_checks._positions(ids))
            seen["forwards"].append({"logits": columns_of(logits, columns), "all-reduce sizes": [c.numel for c in log.all_reduces]})
        ids = torch.tensor([sequence])
        cache = KVCache(model.config.n_layer)
        for start, end in zip(bounds, bounds[1:]):
            with CollectiveLog() as log:
                logits = tp(ids[:, start:end], torch.arange(start, end)[None], cache)
            seen["chunks"].append({"logits": columns_of(logits, columns), "all-reduce sizes": [c.numel for c in log.all_reduces]})
        seen["cache"] = {"length": len(cache), "keys": [None if k is None else list(k.shape) for k in cache.keys]}
        for prompt, n, eos in cases:
            with CollectiveLog() as log:
                try:
                    tokens = impl.generate(tp, list(prompt), n, eos)
                except NotImplementedError:
                    raise
                except Exception as error:  # noqa: BLE001 - a refused request: its class is compared
                    tokens = f"raised {type(error).__name__}"
            seen["generate"].append({"tokens": tokens, "all-reduce sizes": [c.numel for c in log.all_reduces]})
        readings[side] = seen
    return readings


@st.composite
def scenarios_9bc(draw):
    """A small random GPT-2 with 2-4 heads and a short context, a world size that divides its heads (2 or 3); batches
    of 1-2 rows with lengths biased to 1 and the context; one sequence fed in chunks (1 token, then more, to the
    context's edge); generate requests biased to the edges: a prompt of 1 token, one that fills the context with
    max_new_tokens exactly, an EOS the model produces, and refused ones (max_new_tokens 0, an empty prompt, past
    the context)."""
    config = draw(small_config(max_layers=2, n_positions=(16, 24)).filter(lambda c: c.n_head > 1))
    world_size = draw(st.sampled_from([w for w in (2, 3) if config.n_head % w == 0]))
    context = config.n_positions
    batches = []
    for _ in range(draw(st.integers(1, 2))):
        rows, length = draw(st.integers(1, 2)), draw(around(1, context, low=1, high=context))
        batches.append([draw(st.lists(token_ids(), min_size=length, max_size=length)) for _ in range(rows)])
    cuts = draw(st.lists(st.integers(2, context - 1), max_size=3))
    bounds = sorted({0, 1, *cuts, draw(st.sampled_from([context, context - 1]))})
    sequence = draw(st.lists(token_ids(), min_size=bounds[-1], max_size=bounds[-1]))
    cases = []
    for _ in range(draw(st.integers(1, 2))):
        prompt = draw(prompts(1, context - 1, min_len=1, max_len=context - 1))
        left = context - len(prompt)
        n = draw(st.one_of(st.just(left), around(1, left, low=1, high=left)))
        cases.append((prompt, n, draw(st.one_of(st.just("default"), st.just(-1), st.integers(0, 3)))))
    bad = draw(st.sampled_from([(list(range(3)), 0), ([], 2), (list(range(context - 1)), 2)]))
    columns = sorted(draw(st.sets(st.integers(0, config.vocab_size - 1), min_size=COLUMNS, max_size=COLUMNS)) | {0, gpt.EOS_TOKEN_ID})
    return config, world_size, batches, sequence, bounds, cases, bad, columns


def test_differential_9b(student, pool, seed):
    """As test_differential_9c, without generate (9c's): the forwards and the chunks through the KV cache only."""
    check_on_ranks(student, pool, seed, with_generate=False)


def test_differential_9c(student, pool, seed):
    """ParallelGPT's forward (its blocks', attentions' and MLPs'), and generate, against the reference's, on W ranks
    (the checker's processes) of small random models with other layer, head and width counts than tiny's: every rank's
    logits at chosen columns and each position's largest (within TOLERANCE) and its all-reduces (how many, of what
    size) for plain forwards, for a sequence fed in chunks through the KV cache (and the cache's shape: this rank's
    heads), and generate's tokens (greedy: near ties tolerated) with their all-reduces (the prompt once, one token
    per forward, none after the EOS), at the context's edge and for refused requests (the error class)."""
    check_on_ranks(student, pool, seed, with_generate=True)


def check_on_ranks(student, pool, seed, with_generate):
    def check(scenario):
        config, world_size, batches, sequence, bounds, cases, bad, columns = scenario
        model = small_model(config)
        resolved = []
        for prompt, n, eos in cases if with_generate else ():  # 9b's check calls no generate  # an EOS the model produces: the eos-th token of the reference's generate
            if eos == "default":
                eos = gpt.EOS_TOKEN_ID
            elif eos >= 0:
                produced = ex2.generate(model, prompt, n, -1)
                eos = produced[min(eos, len(produced) - 1)]
            resolved.append((prompt, n, eos))
        if with_generate:
            resolved.append((*bad, gpt.EOS_TOKEN_ID))
        runs = on_ranks(pool, student, differential_on_rank, world_size, dataclasses.astuple(config), columns, batches,
                        sequence, bounds, resolved, timeout_s=90)
        twins = Twins("reference", "yours", hint=PARTS_HINT + f" For generate, see {HINTS}, 9c: generate.", tol=DIFF_TOLERANCE)
        for rank, run in enumerate(runs):
            def wrap(seen):  # greedy tokens: equal, or parted at a near tie only
                return {**seen, "generate": [{**g, "tokens": GreedyTokens(g["tokens"], model, tuple(p)) if isinstance(g["tokens"], list) else g["tokens"]}
                                             for g, (p, _, _) in zip(seen["generate"], resolved)]}
            generates = f"; generate(prompt, max_new_tokens, eos) for {[(p, n, e) for p, n, e in resolved]}" if with_generate else ""
            twins.call(f"rank {rank} of {world_size}: ParallelGPT(model with {config.n_layer} layers, {config.n_head} heads, width "
                       f"{config.n_embd}, context {config.n_positions}); forwards of batches {[list(map(len, b)) for b in batches]} "
                       f"(rows x lengths); one sequence fed in chunks {bounds} through a KVCache{generates}", lambda side: wrap(run[side]))

    # No named edges here (issue 41): a scenario runs on W processes of the checker's pool, so one more would add half
    # again to this check's time. Every scenario draws its edges itself instead: a refused request (`bad`), a chunk
    # ending at the context's last position or one short of it (`bounds`), a prompt of one token (`cases`).
    explore(scenarios_9bc(), check, seed=seed, examples=2, name="scenario_9c" if with_generate else "scenario_9b")


class ReferenceMain:
    """The reference's side of main(), without processes: the tokens its ranks return are those of exercise 2's
    generate on the whole model (greedy; what test_9c_greedy_matches_single_process checks of the reference), so
    the checker spawns ranks for your launch only (a launch costs seconds of starting Python and torch per rank)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def __getattr__(self, name):
        return getattr(reference, name)

    def main(self, argv):
        args = dict(zip(argv[::2], argv[1::2]))
        return ex2.generate(self.model, self.tokenizer.encode(args["--prompt"]), int(args["--max-new-tokens"]))


def test_differential_9d(student, model, tokenizer, seed):
    """launch, main and generate_on_rank (and free_port) against the reference: a world size below 1 refused at once
    (the error class), and main(["--world-size", W, ...]) for W = 1 or 2, which launches generate_on_rank on the
    tiny model in W new processes: the same greedy tokens as the reference's ranks (exercise 2's generate)."""
    use_loopback_for_gloo()

    def check(scenario):
        world_size, bad, prompt, n = scenario
        twins = Twins(ReferenceMain(model, tokenizer), student, hint=f"see {HINTS}, 9d: launch")
        twins.call("free_port()", lambda m: (lambda port: {"type": type(port).__name__, "a port": isinstance(port, int) and 0 < port < 65536})(m.free_port()))
        twins.call(f"launch(probe, {bad}, 7)", lambda m: m.launch(parallel_checks.probe, bad, 7))
        argv = ["--world-size", str(world_size), "--prompt", prompt, "--max-new-tokens", str(n)]
        prefix = tuple(tokenizer.encode(prompt))
        twins.call(f"main({argv}): launch(generate_on_rank, {world_size}, 'tiny', ...)", lambda m: GreedyTokens(m.main(argv), model, prefix))

    strategy = st.tuples(st.just(1), st.sampled_from([0, -1]), st.sampled_from(["ROMEO:", "A", "To be, or not"]),
                         st.integers(1, 3))
    # No named edges (issue 41): one scenario launches W new processes (seconds each), and every scenario already holds
    # the refused world size (0 or -1) beside W = 1.
    explore(strategy, check, seed=seed, examples=1, name="scenario_9d")
