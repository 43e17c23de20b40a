"""Checker for exercise 5, the paged KV cache: pytest exercises/test_ex5_paged_kv_cache.py (-k 5a, 5b, 5c, 5d, 5e)"""

import dataclasses
import functools
import inspect
import math
import random
import time
import types

import pytest
import torch
from hypothesis import reject
from hypothesis import strategies as st

import gpt
import solutions.ex4_continuous_batching as ex4
import solutions.ex5_paged_kv_cache as reference
from workshop.serving.sampling import SamplingParams
from workshop.grading.batch_checks import compare_with_alone
from workshop.grading.differential import Divergence, Tolerance, Twins, explore, tolerance
from workshop.grading.harness import count_model_work, implementation, paired_timing, refused, tie_epsilon
from workshop.grading.scenarios import around, dtype_name, dtypes, small_config, small_model, token_ids
from workshop.grading.wording import ordinal, plural
from workshop.serving.workloads import mixed_workload, sample_prompts, with_eos_inside

NO_EOS = -1  # a token id that never comes: every request runs to its max_new_tokens
HINTS = "exercises/hints/ex5.md"
WORKED_EXAMPLE = "Alan Turing is a computer scientist"  # the course's slide: 6 tokens, block size 4
COMPLETION = (" and", " mathematician", " renowned")
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "5a": ["BlockAllocator.allocate", "BlockAllocator.share", "BlockAllocator.free", "BlockTable.blocks_needed",
            "BlockTable.append", "BlockTable.slot_mapping"],
    "5b": ["PagedKVCache.write", "pack", "paged_attention"],
    "5c": ["Engine.schedule", "Engine.preempt", "Engine.step"],
    "5d": ["BlockTable.fork", "block_hashes", "Engine.prefix_hits"],
    "5e": ["beam_step"],
}
DIFFERENTIAL_API = {  # each public name of the stub -> the check that runs it against the reference
    "NoFreeBlocks": "test_5a_differential_blocks", "BlockAllocator": "test_5a_differential_blocks",
    "BlockAllocator.allocate": "test_5a_differential_blocks", "BlockAllocator.share": "test_5a_differential_blocks",
    "BlockAllocator.free": "test_5a_differential_blocks", "BlockAllocator.cache": "test_5d_differential_blocks",
    "BlockAllocator.cached_block": "test_5d_differential_blocks",
    "BlockAllocator.check_block": "test_5a_differential_blocks", "check_step": "test_5b_differential_paged_forward",
    "BlockAllocator.num_free_blocks": "test_5a_differential_blocks", "BlockTable": "test_5a_differential_blocks",
    "BlockTable.blocks_needed": "test_5a_differential_blocks", "BlockTable.append": "test_5a_differential_blocks",
    "BlockTable.slot_mapping": "test_5a_differential_blocks", "BlockTable.fork": "test_5d_differential_blocks",
    "BlockTable.free": "test_5a_differential_blocks",
    "PagedKVCache": "test_5b_differential_paged_forward", "PagedKVCache.write": "test_5b_differential_paged_forward",
    "PackedBatch": "test_5b_differential_paged_forward", "pack": "test_5b_differential_paged_forward",
    "paged_attention": "test_5b_differential_paged_forward",
    "attention_forward": "test_5b_differential_paged_forward", "pack_groups": "test_5b_differential_paged_forward",
    "forward": "test_5b_differential_paged_forward",
    "Engine": "test_5c_differential_engine", "Engine.add_request": "test_5c_differential_engine",
    "Engine.clock": "test_5c_differential_engine", "Engine.receive_arrivals": "test_5c_differential_engine",
    "Engine.schedule": "test_5c_differential_engine", "Engine.reserve": "test_5c_differential_engine",
    "Engine.preempt": "test_5c_differential_engine", "Engine.run_model": "test_5c_differential_engine",
    "Engine.step": "test_5c_differential_engine", "Engine.add_token": "test_5c_differential_engine",
    "Engine.record_memory": "test_5c_differential_engine",
    "Engine.wait_for_next_arrival": "test_5c_differential_engine", "Engine.run": "test_5c_differential_engine",
    "generate": "test_5c_differential_engine", "Request": "test_5c_differential_engine",
    "Sequence": "test_5c_differential_engine", "Sequence.token_ids": "test_5c_differential_engine",
    "Sequence.ttft": "test_5c_differential_engine", "Sequence.tpot": "test_5c_differential_engine",
    "Sequence.latency": "test_5c_differential_engine", "EngineStats": "test_5c_differential_engine",
    "EngineStats.computed_tokens": "test_5c_differential_engine",
    "EngineStats.peak_blocks": "test_5c_differential_engine",
    "EngineStats.kv_utilization": "test_5c_differential_engine",
    "EngineStats.throughput": "test_5c_differential_engine", "EngineResult": "test_5c_differential_engine",
    "EngineResult.outputs": "test_5c_differential_engine",
    "block_hashes": "test_5d_differential_block_hashes",
    "Engine.prefix_hits": "test_5d_differential_engine_sharing",
    "PagedKVCache.copy_block": "test_5d_differential_engine_sharing", "sample": "test_5d_differential_engine_sharing",
    "DecodeBatch": "test_5c_differential_engine", "DecodeBatch.update": "test_5c_differential_engine",
    "DecodeBatch.upload": "test_5c_differential_engine",
    "beam_step": "test_5e_differential_beam_step",
}


@pytest.fixture(scope="module")
def student():
    return implementation("ex5_paged_kv_cache")


@pytest.fixture(scope="module")
def workload(model, seed):
    """Twelve requests, prompts of 1 to 48 tokens (half with GPT-2's EOS inside), outputs of 1 to 40 tokens."""
    workload = mixed_workload(model, 12, prompt_len=(1, 48), output_len=(1, 40), seed=seed + 4)
    workload.prompts = with_eos_inside(workload.prompts, seed)
    return workload


def requests_of(module, prompts, max_new_tokens, **fields):
    return [module.Request(list(p), m, **{k: v[i] for k, v in fields.items()}) for i, (p, m) in enumerate(zip(prompts, max_new_tokens))]


# ----------------------------------------------------------------------------------------------
# Running the student's engine, watching it after every step

class Watch:
    """What the engine looked like after each step, and the work the model saw (one entry per forward)."""

    def __init__(self):
        self.forward_rows = []  # tokens through the model, per forward pass
        self.outputs = []  # per step: {sequence id: tokens it has}
        self.running = []  # per step: ids of the running sequences, in engine.running's order
        self.admitted = {}  # sequence id -> steps at which it became running (first admission, resumptions)
        self.preempted = {}  # sequence id -> steps at which it stopped running unfinished


def check_blocks(engine, step, what):
    """The pool's bookkeeping after a step: every block owned by as many running sequences as its ref
    count says, the free count right, and every table exactly as long as its computed tokens need."""
    allocator, bs = engine.allocator, engine.block_size
    owners = [0] * allocator.num_blocks
    for seq in engine.running:
        table = seq.block_table
        assert table is not None, f"{what}: after step {step}, running sequence {seq.id} has no block table."
        assert len(set(table.blocks)) == len(table.blocks), (
            f"{what}: after step {step}, sequence {seq.id}'s block table {table.blocks} holds a block twice.")
        for block in table.blocks:
            owners[block] += 1
        need = math.ceil(seq.num_computed / bs)
        assert len(table.blocks) == need, (
            f"{what}: after step {step}, sequence {seq.id} has {seq.num_computed} tokens in the cache, which need "
            f"ceil({seq.num_computed} / {bs}) = {need} blocks, but its table holds {len(table.blocks)}. A block is allocated "
            f"exactly when the last one is full, on demand ({HINTS}, BlockTable.append, hint 1).")
    wrong = [(b, owners[b], allocator.ref_counts[b]) for b in range(allocator.num_blocks) if owners[b] != allocator.ref_counts[b]]
    assert not wrong, (
        f"{what}: after step {step}, blocks whose ref count is not the number of running sequences holding them "
        f"(block, holders, ref count): {wrong[:6]}. {'A finished or preempted sequence must free its blocks; ' if any(o < r for _, o, r in wrong) else ''}"
        f"every owner frees exactly once ({HINTS}, BlockAllocator.free, hint 1).")
    free = sum(count == 0 for count in allocator.ref_counts)
    assert allocator.num_free_blocks == free, (
        f"{what}: after step {step}, {free} blocks have ref count 0 but the allocator says {allocator.num_free_blocks} are "
        f"free ({HINTS}, BlockAllocator.free, hint 1).")


def run(student, model, requests, max_batch_size, eos_token_id=NO_EOS, **options):
    """The student's Engine over `requests`, its bookkeeping checked after every step. Returns the result
    and a Watch of what happened."""
    engine = student.Engine(model, max_batch_size, eos_token_id=eos_token_id, **options)
    watch, what = Watch(), f"Engine(max_batch_size={max_batch_size}, {', '.join(f'{k}={v}' for k, v in options.items())})"
    step = engine.step
    before = set()

    def watched_step():
        nonlocal before
        steps = engine.stats.steps
        step()
        if engine.stats.steps == steps:
            return
        index = len(watch.outputs)
        check_blocks(engine, index, what)
        now = {seq.id for seq in engine.running}
        for seq in engine.running:
            if seq.id not in before:
                watch.admitted.setdefault(seq.id, []).append(index)
        for seq in engine.sequences:
            if seq.id in before and seq.id not in now and seq.finished_step < 0:
                watch.preempted.setdefault(seq.id, []).append(index)
        before = now
        watch.outputs.append({seq.id: len(seq.output_ids) for seq in engine.sequences})
        watch.running.append([seq.id for seq in engine.running])
        batch = engine.stats.batch_sizes[-1] if engine.stats.batch_sizes else 0
        if len(engine.running) > max_batch_size or batch > max_batch_size:
            forked = sorted({seq.request.n for seq in engine.running if seq.request.n > 1})
            raise AssertionError(
                f"{what}: after step {index}, {len(engine.running)} sequences run (ids {[seq.id for seq in engine.running]}) "
                f"and the step's forward held {batch}; max_batch_size is {max_batch_size}. "
                + (f"Requests with n = {forked} run here: a request's n continuations need n seats from its admission on, "
                   f"and a running prompt (maybe computed in chunks over several steps) still holds the seats of the forks "
                   f"that join when it is done. " if forked else "")
                + f"Count every seat taken before admitting ({HINTS}, Engine.schedule, hint 2).")

    engine.step = watched_step
    hook = model.transformer.wte.register_forward_hook(lambda module, args, out: watch.forward_rows.append(args[0].numel()))
    try:
        result = engine.run(requests)
    except Exception as error:
        if type(error).__name__ != "NoFreeBlocks":  # the student's class, or one of the reference's pieces it uses
            raise
        raise AssertionError(
            f"{what}: NoFreeBlocks at step {len(watch.outputs)} ({error}). The scheduler decided on work whose blocks were "
            f"not free: before scheduling a sequence it must know every block its append will take, the copy of a shared, "
            f"partly filled last block included (BlockTable.blocks_needed), and an admission's prefix hits that are free "
            f"cached blocks leave the free list when shared, so they cannot also pay for its new blocks "
            f"({HINTS}, Engine.schedule, hint 2; BlockTable.blocks_needed, hint 1).") from None
    finally:
        hook.remove()
    allocator = engine.allocator
    assert allocator.num_free_blocks == allocator.num_blocks and not any(allocator.ref_counts), (
        f"{what}: after the run, {allocator.num_blocks - allocator.num_free_blocks} of {allocator.num_blocks} blocks are still "
        f"owned (ref counts {[c for c in allocator.ref_counts if c][:10]}): a finished sequence frees every block, in the step "
        f"of its last token ({HINTS}, Engine.step, hint 2).")
    return result, watch, what


def check_outputs(result, requests, model, tokenizer, eos_token_id, what):
    sequences = getattr(result, "sequences", None)
    assert isinstance(sequences, list) and len(sequences) == len(requests), (
        f"{what}: expected result.sequences to hold {len(requests)} sequences, one per request in the order submitted; "
        f"got {len(sequences) if isinstance(sequences, list) else type(sequences).__name__}.")
    for i, (seq, request) in enumerate(zip(sequences, requests)):
        assert seq.finished_step >= 0, (f"{what}: request {i} never finished{' (it was preempted)' if seq.preemptions else ''}: "
                                        f"the engine never drops a request; a preempted one waits at the front of the queue "
                                        f"and resumes ({HINTS}, Engine.preempt, hint 1).")
        eos = reference.EOS_TOKEN_ID if eos_token_id is None else eos_token_id
        problem = compare_with_alone(seq.output_ids, model, request.prompt_ids, request.max_new_tokens, tokenizer, eos)
        assert problem is None, (f"{what}: request {i} (prompt of {plural(len(request.prompt_ids), 'token')}, max_new_tokens="
                                 f"{request.max_new_tokens}, preempted {seq.preemptions} times) differs from the same request "
                                 f"generated alone.\n{problem}")
    assert sorted(result.finish_order) == list(range(len(requests))), (
        f"{what}: finish_order should name every sequence once, got {sorted(result.finish_order)}: a request was "
        f"{'lost' if len(set(result.finish_order)) < len(requests) else 'finished twice'}.")


def check_work(result, watch, what, hits=None):
    """One forward per step, exactly the scheduled tokens through the model, none of them padding: each
    sequence computes its prompt (less its prefix hits) and every output token but the last."""
    stats = result.stats
    assert len(watch.forward_rows) == stats.steps == len(stats.scheduled_tokens), (
        f"{what}: {len(watch.forward_rows)} forward passes for {stats.steps} steps (stats.scheduled_tokens has "
        f"{len(stats.scheduled_tokens)} entries): each step runs ONE forward over every scheduled token ({HINTS}, Engine.step, hint 1).")
    assert watch.forward_rows == list(stats.scheduled_tokens), (
        f"{what}: the model saw {watch.forward_rows[:12]}... tokens per step, stats.scheduled_tokens says "
        f"{list(stats.scheduled_tokens)[:12]}...: a step's forward holds exactly the scheduled tokens, no padding.")
    if not stats.preemptions:
        hits = hits or [0] * len(result.sequences)
        needed = sum(len(seq.request.prompt_ids) + len(seq.output_ids) - 1 - h for seq, h in zip(result.sequences, hits))
        assert sum(watch.forward_rows) == needed, (
            f"{what}: the model computed {sum(watch.forward_rows)} token positions; this workload needs {needed}: every prompt "
            f"token{' not found in the prefix cache' if any(hits) else ''} and every output token but the last, once each, "
            f"no padding ({HINTS}, Engine.schedule, hint 2).")
    assert stats.generated_tokens == sum(len(seq.output_ids) for seq in result.sequences)


# ----------------------------------------------------------------------------------------------
# 5a: the block allocator and the block table

def test_5a_allocator_counts_owners_and_never_hands_a_block_out_twice(student, seed):
    """Random allocate/share/free against a model of who owns what; exhaustion and double free are errors."""
    rng = random.Random(seed)
    allocator = student.BlockAllocator(8, block_size=4)
    counts = [0] * 8
    for op in range(300):
        owned = [b for b in range(8) if counts[b]]
        action = rng.choice(["allocate", "allocate", "share", "free", "free"])
        if action == "allocate" and len(owned) < 8:
            block = allocator.allocate()
            assert 0 <= block < 8 and counts[block] == 0, (
                f"operation {op}: allocate() returned block {block}, which {'is owned ' + str(counts[block]) + ' times' if 0 <= block < 8 else 'is not in the pool of 8'}: "
                f"only a free block may be handed out ({HINTS}, BlockAllocator.allocate, hint 1).")
            counts[block] = 1
        elif action == "share" and owned:
            block = rng.choice(owned)
            allocator.share(block)
            counts[block] += 1
        elif action == "free" and owned:
            block = rng.choice(owned)
            allocator.free(block)
            counts[block] -= 1
        assert list(allocator.ref_counts) == counts and allocator.num_free_blocks == counts.count(0), (
            f"after operation {op} ({action}), ref counts {list(allocator.ref_counts)} and {allocator.num_free_blocks} free blocks; "
            f"expected {counts} and {counts.count(0)} free ({HINTS}, BlockAllocator.free, hint 1).")
    for block in range(8):
        while counts[block]:
            allocator.free(block)
            counts[block] -= 1
    blocks = [allocator.allocate() for _ in range(8)]
    assert sorted(blocks) == list(range(8)), f"allocating the whole pool of 8 gave {blocks}: every block exactly once."
    with pytest.raises(student.NoFreeBlocks) as error:
        allocator.allocate()
    assert len(str(error.value)) > 20, "NoFreeBlocks needs a sentence saying what is wrong and what to do."
    allocator.free(blocks[0])
    with pytest.raises(ValueError):  # a double free corrupts the pool: refuse it
        allocator.free(blocks[0])


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_5a_block_table_takes_a_block_exactly_when_the_last_is_full(student, block_size):
    """At lengths k*bs - 1, k*bs and k*bs + 1: appended token by token, in one go, and in chunks."""
    lengths = sorted({n for k in (1, 2, 3) for n in (k * block_size - 1, k * block_size, k * block_size + 1) if n > 0})
    for n in lengths:
        for chunks in ([1] * n, [n], [min(3, n), n - min(3, n)]):
            allocator = student.BlockAllocator(8, block_size=block_size)
            table, total = student.BlockTable(block_size), 0
            for chunk in chunks:
                predicted = table.blocks_needed(chunk, allocator)
                held = len(table.blocks)
                copies = table.append(chunk, allocator)
                total += chunk
                assert copies == [] or copies is None or list(copies) == [], f"append copied blocks {copies} with nothing shared."
                assert len(table.blocks) == math.ceil(total / block_size) and table.num_tokens == total, (
                    f"block size {block_size}, after appending {chunks[:chunks.index(chunk) + 1] if len(chunks) < 6 else str(total) + ' tokens one by one'}: "
                    f"{total} tokens need ceil({total} / {block_size}) = {math.ceil(total / block_size)} blocks; the table holds "
                    f"{len(table.blocks)} (num_tokens {table.num_tokens}). A new block exactly when the last one is full: "
                    f"{block_size} tokens fit in one block, the {ordinal(block_size + 1)} needs a second ({HINTS}, BlockTable.append, hint 1).")
                assert predicted == len(table.blocks) - held, (
                    f"block size {block_size}, {total - chunk} tokens held: blocks_needed({chunk}) said {predicted}, append({chunk}) "
                    f"took {len(table.blocks) - held} ({HINTS}, BlockTable.blocks_needed, hint 1).")
            assert len(set(table.blocks)) == len(table.blocks) and allocator.num_free_blocks == 8 - len(table.blocks)
            table.free(allocator)
            assert allocator.num_free_blocks == 8, (
                f"after BlockTable.free of a table that held every block it took, {allocator.num_free_blocks} of 8 blocks are "
                f"free, not 8: BlockTable.free gives each of its blocks back with BlockAllocator.free, which returns a block "
                f"nobody owns any more to the free list ({HINTS}, BlockAllocator.free, hint 1).")


def test_5a_the_course_worked_example(student, tokenizer):
    """The course's slide: "Alan Turing is a computer scientist" (6 tokens) in blocks of 4, then " and",
    " mathematician", " renowned" one by one: which blocks fill, and when the third one comes."""
    prompt = tokenizer.encode(WORKED_EXAMPLE)
    allocator = student.BlockAllocator(8, block_size=4)
    table = student.BlockTable(4)
    table.append(len(prompt), allocator)
    story = [("the prompt", [4, 2])] + [(repr(word), fills) for word, fills in zip(COMPLETION, ([4, 3], [4, 4], [4, 4, 1]))]
    for i, (event, expected) in enumerate(story):
        if i:
            table.append(len(tokenizer.encode(COMPLETION[i - 1])), allocator)
        fills = [min(4, table.num_tokens - 4 * b) for b in range(len(table.blocks))]
        assert fills == expected and len(set(table.blocks)) == len(table.blocks), (
            f"after {event}: the table holds {len(table.blocks)} blocks filled {fills} (physical {table.blocks}), the slide "
            f"shows {expected}: blocks come on demand, one when the last is full ({HINTS}, BlockTable.append, hint 1).")


@pytest.mark.parametrize("bs", [4, 3, 6])  # not only powers of two: there block * bs + offset equals block * bs | offset
def test_5a_slot_mapping_goes_through_the_block_table(student, seed, bs):
    """Slots are physical block * block_size + offset, for blocks scattered over the pool, at block edges."""
    rng = random.Random(seed)
    allocator = student.BlockAllocator(12, block_size=bs)
    blocks = [allocator.allocate() for _ in range(12)]
    rng.shuffle(blocks)
    for block in blocks:  # now the free list is in a random order: physical ids are not logical ones
        allocator.free(block)
    table = student.BlockTable(bs)
    n = 3 * bs - 1
    table.append(n, allocator)
    expected = [table.blocks[p // bs] * bs + p % bs for p in range(n)]
    for start, end in [(0, n), (bs - 1, bs + 1), (bs, 2 * bs), (2 * bs - 1, 2 * bs + 1), (n - 1, n), (2 * bs, 2 * bs)]:
        got = table.slot_mapping(start, end)
        assert list(got) == expected[start:end], (
            f"block table {table.blocks} (block size {bs}): slot_mapping({start}, {end}) gave {list(got)}, expected "
            f"{expected[start:end]}: position p lives in physical block blocks[p // {bs}] at offset p % {bs}, so its slot is "
            f"blocks[p // {bs}] * {bs} + p % {bs} ({HINTS}, BlockTable.slot_mapping, hint 1).")


# ----------------------------------------------------------------------------------------------
# 5b: paged attention

def scattered_tables(lengths, block_size, num_blocks, seed):
    """Block tables for sequences of `lengths` tokens, their blocks drawn at random from the pool."""
    pool = list(range(num_blocks))
    random.Random(seed).shuffle(pool)
    tables = []
    for n in lengths:
        k = math.ceil(n / block_size)
        tables.append(pool[:k])
        pool = pool[k:]
    return tables


@torch.no_grad()
def full_logits(model, tokens):
    """The last position's logits of a plain forward over the whole sequence (no cache)."""
    ids = torch.tensor([tokens], device=model.device)
    return model(ids, torch.arange(len(tokens), device=model.device)[None])[0, -1]


def check_logits(got, sequences, model, what):
    assert tuple(got.shape) == (len(sequences), model.config.vocab_size), (
        f"{what}: forward returned logits of shape {tuple(got.shape)}, expected [{len(sequences)}, {model.config.vocab_size}]: "
        f"one row per sequence, for its last new token.")
    for row, tokens in enumerate(sequences):
        expected = full_logits(model, tokens)
        diff = (got[row].float() - expected.float()).abs().max().item()
        assert diff < 1e-3, (
            f"{what}: sequence {row} ({plural(len(tokens), 'token')}) gets logits {diff:.3g} away from a plain forward over its tokens. "
            f"Each new key and value goes to its own slot, and each query sees exactly its own sequence's keys up to its "
            f"position ({HINTS}, pack, hint 1; paged_attention, hint 1).")


def test_5b_one_forward_prefills_sequences_of_every_length(student, model, seed):
    """Five prompts (1, bs-1, bs, bs+1 and 2*bs+5 tokens) in ONE packed forward, blocks scattered over the pool."""
    bs = 4
    lengths = [1, bs - 1, bs, bs + 1, 2 * bs + 5]
    prompts = [sample_prompts(model, 1, n, n, seed + n)[0] for n in lengths]
    tables = scattered_tables([n + 4 for n in lengths], bs, 32, seed)
    cache = student.PagedKVCache(model.config, 32, bs, model.device)
    logits = student.forward(model, cache, prompts, [0] * len(prompts), tables)
    check_logits(logits, prompts, model, f"forward over prompts of {lengths} tokens (block size {bs})")


def test_5b_decodes_and_chunks_share_a_forward(student, model, seed):
    """After a prefill, forwards that mix decode tokens, a prompt chunk of a running sequence and a new
    sequence's first chunk: queries at any position, over keys written in earlier steps and in this one."""
    bs = 4
    prompts = [sample_prompts(model, 1, n, n, seed + 10 + n)[0] for n in (3, 8, 9, 30)]
    tables = scattered_tables([40] * len(prompts), bs, 48, seed)
    cache = student.PagedKVCache(model.config, 48, bs, model.device)
    # step 1: the first three prompts whole, the fourth's first 13 tokens
    chunks = [prompts[0], prompts[1], prompts[2], prompts[3][:13]]
    logits = student.forward(model, cache, chunks, [0, 0, 0, 0], tables)
    check_logits(logits, chunks, model, "step 1 (three prompts and a 13-token chunk of a 30-token prompt)")
    sequences = [list(c) for c in chunks]
    rng = random.Random(seed)
    for step, chunk_len in [(2, 7), (3, 10)]:  # three decode tokens each, and the next chunk of the long prompt
        new = [[rng.randrange(model.config.vocab_size)] for _ in range(3)] + [prompts[3][len(sequences[3]):len(sequences[3]) + chunk_len]]
        starts = [len(s) for s in sequences]
        logits = student.forward(model, cache, new, starts, tables)
        sequences = [s + n for s, n in zip(sequences, new)]
        check_logits(logits, sequences, model, f"step {step} (three decode tokens at positions {starts[:3]} and a chunk of "
                                               f"{chunk_len} tokens at positions {starts[3]}-{starts[3] + chunk_len - 1})")


def test_5b_write_fills_the_pool_in_place(student, model, seed):
    """The pools are allocated once: a forward writes the new keys and values INTO the tensors the cache was built
    with (the same objects, the same memory), never into new tensors put in their place."""
    bs = 4
    prompts = [sample_prompts(model, 1, n, n, seed + 90 + n)[0] for n in (5, 11)]
    tables = scattered_tables([n + 4 for n in (5, 11)], bs, 16, seed)
    cache = student.PagedKVCache(model.config, 16, bs, model.device)
    pools = [(t, t.data_ptr()) for t in list(cache.keys) + list(cache.values)]
    before = [t.clone() for t, _ in pools]
    logits = student.forward(model, cache, prompts, [0, 0], tables)
    check_logits(logits, prompts, model, "forward over prompts of [5, 11] tokens (block size 4)")
    now = list(cache.keys) + list(cache.values)
    moved = [i for i, ((t, ptr), new) in enumerate(zip(pools, now)) if new.data_ptr() != ptr or t.data_ptr() != ptr]
    untouched = [i for i, ((t, _), old) in enumerate(zip(pools, before)) if torch.equal(t, old)]
    assert not moved and not untouched, (
        f"after a forward, {len(moved)} of the cache's {len(pools)} pools (keys and values of every layer) are new tensors "
        f"put in the place of the ones allocated at the start, and {len(untouched)} of those first tensors were never "
        f"written: the pool is allocated once, and write() stores the new keys and values into it, in place (index_copy_, "
        f"or an indexed assignment into a view of it), never into a copy ({HINTS}, PagedKVCache.write, hint 1).")


# ----------------------------------------------------------------------------------------------
# 5c: the engine

@pytest.mark.parametrize("eos", [NO_EOS, None])
def test_5c_serves_a_mixed_workload(student, model, tokenizer, workload, eos):
    """Every request gets what it gets alone; the blocks add up after every step; the model computes each
    needed token once, with no padding: fewer positions than exercise 4's left-padded batch."""
    requests = requests_of(student, workload.prompts, workload.max_new_tokens)
    result, watch, what = run(student, model, requests, 4, eos_token_id=eos)
    what += f", eos_token_id={eos if eos is not None else 'default'}"
    check_outputs(result, requests, model, tokenizer, eos, what)
    check_work(result, watch, what)
    with count_model_work(model) as padded:
        ex4.generate(model, requests_of(ex4, workload.prompts, workload.max_new_tokens), 4, **({} if eos is None else {"eos_token_id": eos}))
    assert sum(watch.forward_rows) < padded.tokens, (
        f"{what}: the model computed {sum(watch.forward_rows)} token positions, exercise 4's padded batch {padded.tokens}: "
        f"a packed step has no padding, so it should need fewer.")
    stats = result.stats
    for step, (blocks, stored, running) in enumerate(zip(stats.blocks_in_use, stats.tokens_stored, stats.batch_sizes)):
        assert blocks * stats.block_size - stored < stats.block_size * running, (
            f"{what}: at step {step}, {blocks} blocks ({blocks * stats.block_size} slots) hold {stored} tokens for {running} "
            f"sequences: waste should be under one block per sequence.")
    assert 0 < stats.kv_utilization <= 1


def test_5c_admits_first_come_first_served_as_seats_free(student, model, tokenizer, workload, seed):
    """Requests arriving at scripted steps: admitted in arrival order, at once when a seat is free."""
    rng = random.Random(seed)
    arrivals = sorted(rng.randrange(0, 40) for _ in range(len(workload)))
    requests = requests_of(student, workload.prompts, workload.max_new_tokens, arrival_step=arrivals)
    result, _, what = run(student, model, requests, 3)
    what += " with requests arriving at steps " + str(arrivals)
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)
    seqs = result.sequences
    for early in seqs:
        for late in seqs:
            assert not ((arrivals[early.id], early.id) < (arrivals[late.id], late.id) and late.admitted_step < early.admitted_step), (
                f"{what}: request {late.id} (arriving at step {arrivals[late.id]}) was admitted at step {late.admitted_step}, "
                f"before request {early.id} (arriving at step {arrivals[early.id]}), admitted at step {early.admitted_step}: "
                f"first come, first served ({HINTS}, Engine.schedule, hint 1).")
    for seq in seqs:
        assert seq.admitted_step >= arrivals[seq.id], f"{what}: request {seq.id} ran at step {seq.admitted_step}, before it arrived."
        for step in range(arrivals[seq.id], seq.admitted_step):
            running = sum(s.admitted_step <= step <= s.finished_step for s in seqs)
            assert running == 3, (
                f"{what}: at step {step}, request {seq.id} waits while only {running} of 3 seats are taken: a seat freed at one "
                f"step goes to a waiting request at the next ({HINTS}, Engine.schedule, hint 1).")


def test_5c_chunked_prefill_keeps_the_others_decoding(student, model, tokenizer, seed):
    """A token budget of 16 per step: long prompts arriving later are prefilled in chunks over several
    steps, while every request already decoding keeps getting one token per step."""
    short = sample_prompts(model, 3, 4, 12, seed + 20)
    long = sample_prompts(model, 2, 60, 120, seed + 21)
    prompts, limits, arrivals = short + long, [40, 30, 35, 8, 8], [0, 0, 0, 3, 5]
    requests = requests_of(student, prompts, limits, arrival_step=arrivals)
    result, watch, what = run(student, model, requests, 4, max_num_batched_tokens=16)
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)
    check_work(result, watch, what)
    assert max(watch.forward_rows) <= 16, (f"{what}: a forward ran {max(watch.forward_rows)} tokens: a step computes at most "
                                           f"max_num_batched_tokens tokens; split long prompts into chunks ({HINTS}, Engine.schedule, hint 2).")
    for step in range(1, len(watch.outputs)):
        for seq in result.sequences:
            had, has = watch.outputs[step - 1][seq.id], watch.outputs[step][seq.id]
            if 0 < had < seq.request.max_new_tokens:
                assert has == had + 1, (
                    f"{what}: at step {step}, request {seq.id} had {had} tokens and got {has - had} more while a long prompt was "
                    f"prefilled: decoding requests are scheduled first, one token each, and the prompt chunk takes what is "
                    f"left of the budget ({HINTS}, Engine.schedule, hint 2).")
    for seq in result.sequences[3:]:
        first = next(i for i, o in enumerate(watch.outputs) if o[seq.id] > 0)
        assert first - seq.admitted_step + 1 >= math.ceil(len(seq.request.prompt_ids) / 16), (
            f"{what}: request {seq.id}'s prompt of {plural(len(seq.request.prompt_ids), 'token')} gave its first token at step {first}, "
            f"{first - seq.admitted_step + 1} steps after its admission at 16 tokens per step at most.")


def test_5c_preemption_by_recompute_loses_nothing(student, model, tokenizer, seed):
    """A pool so small that blocks run out: the newest running request is preempted, its blocks freed,
    it goes back to the front of the queue, resumes before anyone new is admitted, and ends with the
    output it gets alone. Every request finishes exactly once."""
    workload = mixed_workload(model, 10, prompt_len=(8, 40), output_len=(20, 60), seed=seed + 30)
    bs = 8
    num_blocks = max(math.ceil((len(p) + m - 1) / bs) for p, m in zip(workload.prompts, workload.max_new_tokens)) + 2
    requests = requests_of(student, workload.prompts, workload.max_new_tokens)
    result, watch, what = run(student, model, requests, 4, block_size=bs, num_blocks=num_blocks)
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)
    check_work(result, watch, what)
    per_seq = sum(seq.preemptions for seq in result.sequences)
    assert result.stats.preemptions > 0 and per_seq == result.stats.preemptions == sum(len(v) for v in watch.preempted.values()), (
        f"{what}: with {num_blocks} blocks for 4 running requests, blocks run out and someone must be preempted; stats say "
        f"{result.stats.preemptions} preemptions, the sequences {per_seq}, and {sum(len(v) for v in watch.preempted.values())} "
        f"times a running sequence stopped running unfinished ({HINTS}, Engine.schedule, hint 3).")
    for victim, steps in watch.preempted.items():
        for step in steps:
            before = watch.running[step - 1] if step else []
            survivors = [s for s in before if s in watch.running[step]]
            latest = {s: max(a for a in watch.admitted[s] if a <= step - 1) for s in before}
            newer = [s for s in survivors if latest[s] > latest[victim]]
            assert not newer, (
                f"{what}: at step {step}, request {victim} (running since step {latest[victim]}) was preempted while requests "
                f"{newer}, running since later steps, kept their blocks: the victim is the NEWEST running request ({HINTS}, "
                f"Engine.schedule, hint 3).")
            # Resumed: running again after a step, or (recomputing its last tokens in one step) given a token and done.
            later = [a for a in watch.admitted[victim] if a >= step]
            grew = [s for s in range(step + 1, len(watch.outputs)) if watch.outputs[s][victim] > watch.outputs[step][victim]]
            resumed = min(later[:1] + grew[:1], default=len(watch.outputs))
            overtook = [s for s, admitted in watch.admitted.items() if step <= admitted[0] < resumed]
            assert not overtook, (
                f"{what}: request {victim} was preempted at step {step} and resumed at step {resumed}, but requests {overtook} "
                f"were admitted for the first time in between: a preempted request goes back to the FRONT of the queue "
                f"({HINTS}, Engine.preempt, hint 1).")


def test_5c_rejects_a_request_that_can_never_fit(student, model):
    """A request needing more blocks than the pool has is refused with a sentence before any work; one
    that exactly fits is served."""
    prompt = sample_prompts(model, 1, 10, 10, 3)[0]
    fits = student.Request(prompt, 7)  # 10 + 7 - 1 = 16 positions to cache: 4 blocks of 4
    too_big = student.Request(prompt, 8)  # 17 positions: 5 blocks
    with count_model_work(model) as work, refused(ValueError, "generate(num_blocks=4, block_size=4) with request 1 of 10 prompt tokens "
                                                  "and max_new_tokens=8 (17 positions: 5 blocks, the pool has 4)") as error:
        student.generate(model, [fits, too_big], 2, eos_token_id=NO_EOS, num_blocks=4, block_size=4)
    assert work.forward_passes == 0, f"the request that can never fit was refused after {work.forward_passes} forward passes: check first."
    assert "block" in str(error.value).lower(), f"the refusal should say the pool's blocks are too few: {error.value}"
    result = student.generate(model, [fits], 2, eos_token_id=NO_EOS, num_blocks=4, block_size=4)
    assert len(result.sequences[0].output_ids) == 7, (
        "a request whose prompt and output need exactly the pool's 4 blocks of 4 (the last token is never cached) must be served.")


def test_5c_serves_a_batch_past_256_sequences(student, model, tokenizer, seed):
    """300 requests there at once, max_batch_size 300 (servers run more than vLLM's default of 256 sequences):
    every one finishes with the tokens it gets alone, and one step decodes more than 256 of them."""
    prompts = sample_prompts(model, 4, 2, 5, seed + 256)
    requests = requests_of(student, [prompts[i % 4] for i in range(300)], [3] * 300)
    result, watch, what = run(student, model, requests, 300, num_blocks=304, block_size=16, max_num_batched_tokens=2048)
    assert max(map(len, watch.running)) > 256, f"{what}: at most {max(map(len, watch.running))} of 300 sequences ran at once."
    assert sorted(result.finish_order) == list(range(300)), f"{what}: {len(set(result.finish_order))} of 300 requests finished."
    for i, prompt in enumerate(prompts):
        problem = compare_with_alone(result.sequences[i].output_ids, model, prompt, 3, tokenizer, NO_EOS)
        assert problem is None, f"{what}: request {i} differs from the same request generated alone.\n{problem}"
        others = {tuple(result.sequences[j].output_ids) for j in range(i, 300, 4)}
        assert len(others) == 1, f"{what}: the 75 requests with prompt {i} got {len(others)} different outputs: {sorted(others)[:3]}..."


def test_5c_a_step_with_nothing_scheduled_is_no_step(student, model):
    """When nothing can be scheduled (the only request arrives later), step() does nothing: no forward, no
    token, no block, and it is not a step (the stats do not count it)."""
    prompt = sample_prompts(model, 1, 6, 6, 5)[0]
    engine = student.Engine(model, 2, eos_token_id=NO_EOS, block_size=4)
    engine.add_request(student.Request(prompt, 3, arrival_step=5))
    engine.start = time.perf_counter()
    with count_model_work(model) as work:
        engine.step()
    stats = engine.stats
    counted = {name: getattr(stats, name) for name in ("steps", "batch_sizes", "scheduled_tokens", "blocks_in_use", "tokens_stored")}
    assert work.forward_passes == 0 and stats.steps == 0 and not any(counted[n] for n in counted if n != "steps"), (
        f"step() at step 0, with the only request arriving at step 5, ran {work.forward_passes} forwards and left the stats "
        f"{counted}: nothing scheduled means nothing happens, and it is not a step ({HINTS}, Engine.step, hint 2).")
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks and not engine.running and not stats.generated_tokens, (
        "a step with nothing scheduled must leave the engine as it was: no block taken, nobody running, no token.")


def test_5c_one_sampling_call_per_step(student, model, tokenizer, seed, monkeypatch):
    """Every step that gives tokens gives them all from ONE call of the vectorised sampler (the given sample(),
    which calls workshop.serving.sampling.sample once); a step that only computes prompt chunks samples nothing;
    stats.batch_sizes counts the sequences in each step's forward. One continuation per request: forks are 5d's."""
    check_one_sampling_call_per_step(student, model, tokenizer, seed, monkeypatch, n=1)


def test_5d_forks_sample_in_the_step_s_one_call(student, model, tokenizer, seed, monkeypatch):
    """As test_5c_one_sampling_call_per_step, with a request of two continuations: the forks' first tokens come
    from the same one sampling call as every other token of their step."""
    check_one_sampling_call_per_step(student, model, tokenizer, seed, monkeypatch, n=2)


def check_one_sampling_call_per_step(student, model, tokenizer, seed, monkeypatch, n):
    calls, forwards = [], []
    scope = inspect.unwrap(student.Engine.step).__globals__  # the names the engine's step() calls through (inside its decorator)
    sample_tokens, forward = scope["sample_tokens"], scope["forward"]

    def counted_sample(logits, *args, **kwargs):
        calls.append((len(forwards), len(logits)))
        return sample_tokens(logits, *args, **kwargs)

    def counted_forward(model, cache, token_ids, *args, **kwargs):
        forwards.append(len(token_ids))
        return forward(model, cache, token_ids, *args, **kwargs)

    monkeypatch.setitem(scope, "sample_tokens", counted_sample)
    monkeypatch.setitem(scope, "forward", counted_forward)
    long, short, late = sample_prompts(model, 3, 9, 30, seed + 86)
    sampling = SamplingParams(top_k=10, seed=seed)
    requests = [student.Request(long, 6, n=n, sampling=sampling), student.Request(short, 8),
                student.Request(late, 5, arrival_step=2)]
    result, watch, what = run(student, model, requests, 4, block_size=4, max_num_batched_tokens=10)
    monkeypatch.undo()  # the reference's runs below (check_sequences) are not counted
    check_sequences(result, requests, model, tokenizer, what)
    steps = len(watch.outputs)
    per_step = [[rows for at, rows in calls if at == i + 1] for i in range(steps)]
    given = [sum(watch.outputs[i][q] - (watch.outputs[i - 1][q] if i else 0) for q in watch.outputs[i]) for i in range(steps)]
    wrong = [(i, len(c), g) for i, (c, g) in enumerate(zip(per_step, given)) if len(c) != (1 if g else 0) or sum(c) != g]
    assert not wrong, (
        f"{what}: steps whose tokens did not come from exactly one sampling call (step, calls, tokens given): {wrong[:6]}. "
        f"Sample every sequence whose tokens are all computed, the forks' first tokens included, in ONE call of the given "
        f"sample() per step (a vectorised batch), and none in a step that only computes prompt chunks ({HINTS}, Engine.step, hint 1).")
    stats = result.stats
    assert (not forwards or list(stats.batch_sizes) == forwards) and len(stats.blocks_in_use) == stats.steps, (
        f"{what}: stats.batch_sizes {list(stats.batch_sizes)[:12]}, but the forwards held {forwards[:12]} sequences; "
        f"{len(stats.blocks_in_use)} memory records for {stats.steps} steps: each step records its memory (record_memory) and "
        f"the number of sequences in its forward ({HINTS}, Engine.step, hint 1).")


@pytest.mark.timing
def test_speed_against_reference(student, model, tokenizer, device):
    timed = mixed_workload(model, 24, prompt_len=(4, 48), output_len=(1, 40), seed=0)
    requests = requests_of(student, timed.prompts, timed.max_new_tokens)
    check_outputs(student.generate(model, requests, 4, eos_token_id=NO_EOS), requests, model, tokenizer, NO_EOS, "generate")
    ref_requests = requests_of(reference, timed.prompts, timed.max_new_tokens)
    timing = paired_timing(lambda: student.generate(model, requests, 4, eos_token_id=NO_EOS),
                           lambda: reference.generate(model, ref_requests, 4, eos_token_id=NO_EOS), repeats=3, device=device)
    limit = 2.0 if device == "cpu" else 1.5
    assert timing.ratio < limit, (f"your engine takes {timing.ratio:.2f}x the reference's time (limit {limit}x):\n"
                                  f"{timing.report('yours', 'reference')}")


# ----------------------------------------------------------------------------------------------
# 5d: sharing

def test_5d_copy_on_write_keeps_the_siblings_tokens(student, model, seed):
    """Fork a 37-token sequence (blocks of 16: two full, one partly filled), then write a different token
    into each: the shared partial block is copied before the first write, so each sees its own token."""
    bs, prompt = 16, sample_prompts(model, 1, 37, 37, seed + 40)[0]
    allocator = student.BlockAllocator(10, block_size=bs)
    cache = reference.PagedKVCache(model.config, 10, bs, model.device)  # the reference cache: only your tables are graded here
    parent = student.BlockTable(bs)
    parent.append(37, allocator)
    reference.forward(model, cache, [prompt], [0], [list(parent.blocks)])
    child = parent.fork(allocator)
    assert list(child.blocks) == list(parent.blocks) and all(allocator.ref_counts[b] == 2 for b in parent.blocks), (
        f"after fork(), the child's blocks {list(child.blocks)} should be the parent's {list(parent.blocks)}, each with ref count 2 "
        f"(got {[allocator.ref_counts[b] for b in parent.blocks]}): nothing is copied at a fork ({HINTS}, BlockTable.fork, hint 1).")
    tokens = {"child": [], "parent": []}
    rng = random.Random(seed)
    for _ in range(2):
        for name, table in (("child", child), ("parent", parent)):
            token = rng.randrange(model.config.vocab_size)
            start = 37 + len(tokens[name])
            for src, dst in table.append(1, allocator) or []:
                cache.copy_block(src, dst)
            tokens[name].append(token)
            logits = reference.forward(model, cache, [[token]], [start], [list(table.blocks)])
            expected = full_logits(model, prompt + tokens[name])
            diff = (logits[0] - expected).abs().max().item()
            assert diff < 1e-3, (
                f"after the fork, the {name} wrote token {token} at position {start}; its logits are {diff:.3g} away from its "
                f"own sequence's: the other one's write landed in a block they share. Writing into a shared, partly filled "
                f"block must copy it first ({HINTS}, BlockTable.append, hint 3).")
    shared = [b for b in parent.blocks if b in child.blocks]
    assert shared == list(parent.blocks[:2]) and all(allocator.ref_counts[b] == 2 for b in shared), (
        f"the two full prompt blocks should stay shared (ref count 2) and only the partial one be copied: parent "
        f"{list(parent.blocks)}, child {list(child.blocks)}, ref counts {list(allocator.ref_counts)}.")
    assert allocator.num_free_blocks == 10 - 4, (
        f"{10 - allocator.num_free_blocks} blocks are owned; expected 4 (two shared, one partial block each): a copy frees "
        f"the writer's share of the old block ({HINTS}, BlockTable.append, hint 3).")
    child.free(allocator)
    parent.free(allocator)
    assert allocator.num_free_blocks == 10


def test_5d_parallel_sampling_shares_the_prompt(student, model, tokenizer, seed):
    """n = 3 sampled continuations of one prompt, next to a greedy request: each continuation i is what the
    same request with seed + i gets alone, and the three share the prompt's full blocks."""
    prompt, other = sample_prompts(model, 1, 37, 37, seed + 50)[0], sample_prompts(model, 1, 10, 10, seed + 51)[0]
    sampling = SamplingParams(top_k=10, seed=seed)  # a few kept tokens: float noise cannot move a draw (see pressure_workload)
    requests = [student.Request(prompt, 12, n=3, sampling=sampling), student.Request(other, 12)]
    result, watch, what = run(student, model, requests, 4, block_size=16)
    sequences = result.sequences
    assert len(sequences) == 4 and [s.index for s in sequences[:3]] == [0, 1, 2], (
        f"{what}: a request with n=3 gives 3 sequences (indices 0, 1, 2), then the next request's: got "
        f"{[(s.id, s.index) for s in sequences]}.")
    for i, seq in enumerate(sequences[:3]):
        alone = reference.generate(model, [reference.Request(prompt, 12, sampling=dataclasses.replace(sampling, seed=seed + i))], 1,
                                   eos_token_id=NO_EOS)
        assert seq.output_ids == alone.outputs[0], (
            f"{what}: continuation {i} of the n=3 request got {seq.output_ids}, the same request alone with seed {seed + i} gets "
            f"{alone.outputs[0]}: each continuation samples with its own generator from the logits of its own tokens "
            f"({HINTS}, Engine.step, hint 3).")
    problem = compare_with_alone(sequences[3].output_ids, model, other, 12, tokenizer, NO_EOS)
    assert problem is None, f"{what}: the greedy request next to the sampled ones differs from itself alone.\n{problem}"
    assert result.finish_order and sorted(result.finish_order) == [0, 1, 2, 3]
    needed = 37 + 3 * (12 - 1) + 10 + (12 - 1)
    assert result.stats.computed_tokens == sum(watch.forward_rows) == needed and result.stats.copies >= 1, (
        f"{what}: the model computed {sum(watch.forward_rows)} token positions with {result.stats.copies} block copies; with the "
        f"prompt's blocks shared it needs {needed}: the 37 prompt tokens once for all three continuations, then each one's own "
        f"tokens, and a copy of the shared, partly filled last block before a continuation writes into it "
        f"({HINTS}, Engine.step, hint 3).")


def test_5d_block_hashes_are_chained(student, seed):
    """One hash per full block; equal when the tokens so far are equal; a block's hash depends on every
    block before it."""
    rng = random.Random(seed)
    tokens = [rng.randrange(50257) for _ in range(4 * 5 + 3)]
    hashes = student.block_hashes(tokens, 4)
    assert len(hashes) == 5, f"{plural(len(tokens), 'token')} in blocks of 4 make 5 full blocks (the last 3 tokens hash nothing); got {len(hashes)} hashes."
    assert list(student.block_hashes(list(tokens), 4)) == list(hashes) and len(set(hashes)) == 5
    changed = list(tokens)
    changed[1] = (changed[1] + 1) % 50257  # the first block differs, every later block's tokens are the same
    other = student.block_hashes(changed, 4)
    same = [i for i in range(1, 5) if other[i] == hashes[i]]
    assert other[0] != hashes[0] and not same, (
        f"changing a token of block 0 left the hashes of blocks {same} unchanged: a block's keys and values depend on every "
        f"token before it, so its hash must chain its parent's ({HINTS}, block_hashes, hint 1).")
    repeated = tokens[:4] * 3
    rep = student.block_hashes(repeated, 4)
    assert len(set(rep)) == 3, f"three equal blocks in a row are three different prefixes: got hashes {rep} ({HINTS}, block_hashes, hint 1)."
    for bs in (3, 4, 5):  # every full block, the last one too when the tokens fill it exactly
        for n in (bs - 1, bs, 2 * bs, 2 * bs + 1, 4 * bs - 1, 4 * bs):
            got = list(student.block_hashes(tokens[:n], bs))
            assert got == list(student.block_hashes(tokens, bs))[:n // bs], (
                f"{n} tokens in blocks of {bs}: {n // bs} full blocks, so {n // bs} hashes, the first {n // bs} of all "
                f"{plural(len(tokens), 'token')}' hashes; got {len(got)} ({HINTS}, block_hashes, hint 1).")


def test_5d_block_hashes_depend_on_the_order_of_the_blocks(student, seed):
    """The same blocks in another order are another prefix (their keys and values differ): swapping two blocks
    changes the hash of the later one and of every block after them; the blocks before keep theirs."""
    rng = random.Random(seed + 85)
    bs = rng.choice([2, 4, 8])
    tokens = [rng.randrange(50257) for _ in range(bs * 6 + rng.randrange(bs))]
    hashes = list(student.block_hashes(tokens, bs))
    i = rng.randrange(0, 4)
    j = rng.randrange(i + 1, 6)
    swapped = list(tokens)
    swapped[i * bs:(i + 1) * bs], swapped[j * bs:(j + 1) * bs] = tokens[j * bs:(j + 1) * bs], tokens[i * bs:(i + 1) * bs]
    other = list(student.block_hashes(swapped, bs))
    assert len(other) == len(hashes) == 6, f"{plural(len(tokens), 'token')} in blocks of {bs} make 6 full blocks; got {len(hashes)} hashes."
    same = [b for b in range(j, 6) if other[b] == hashes[b]]
    assert not same, (
        f"blocks {i} and {j} (of 6, block size {bs}) swapped: the hashes of blocks {same} did not change. The same blocks in "
        f"another order are another prefix, whose keys and values differ: chain each hash with its parent's, an ordered "
        f"chain (hash((parent's hash, tuple(tokens)))), not a sum or XOR of the blocks' own hashes, which forgets the order "
        f"({HINTS}, block_hashes, hint 1).")
    assert other[:i] == hashes[:i], f"swapping blocks {i} and {j} changed the hashes of the blocks before them: {other[:i]} vs {hashes[:i]}."


def test_5d_prefix_cache_hits_are_exact(student, model, tokenizer, seed):
    """Scripted prompts sharing a 40-token prefix (blocks of 16): the hits per request are exact, the
    model computes only the rest, and every output equals the request's alone."""
    prefix = sample_prompts(model, 1, 40, 40, seed + 60)[0]
    tails = sample_prompts(model, 3, 3, 9, seed + 61)
    other_start = sample_prompts(model, 1, 16, 16, seed + 62)[0]
    prompts = [prefix + tails[0],  # A: nothing cached yet
               prefix + tails[1],  # B: same step as A: A's two full blocks, not a second copy of them
               prefix[:32],  # C: its whole prompt is cached, but its last token must still be computed: 1 block
               other_start + prefix[16:32] + tails[2],  # D: block 1's tokens are A's, its block 0 is not: no hit
               prefix[:16] + prefix[:16] + tails[2],  # F: block 1 repeats A's block 0 after another prefix: block 0 only
               prefix + tails[2]]  # E: arrives after A, B, C have finished: their freed blocks still cache the prefix
    hits = [0, 32, 16, 0, 16, 32]
    requests = requests_of(student, prompts, [5] * 6, arrival_step=[0, 0, 0, 0, 0, 20])
    result, watch, what = run(student, model, requests, 4, block_size=16, enable_prefix_caching=True)
    check_outputs(result, requests, model, tokenizer, NO_EOS, what)
    got = [seq.prefix_hit_tokens for seq in result.sequences]
    names = "ABCDFE"
    wrong = [f"{names[i]}: {g} (expected {e})" for i, (g, e) in enumerate(zip(got, hits)) if g != e]
    assert not wrong, (
        f"{what}: prefix hits per request (tokens) {wrong}. A: first; B: the same 40-token prefix in the same step (2 full "
        f"blocks); C: the first 32 tokens exactly (a full hit still computes its last token, so only block 0); D: block 1's "
        f"tokens follow another block 0 (the chain differs); F: its block 1 holds the tokens of A's block 0, after a prefix "
        f"(hashes chain); E: after A-C finished, their freed blocks are still cached "
        f"({HINTS}, Engine.prefix_hits, hint 1).")
    assert result.stats.prefix_hit_tokens == sum(hits)
    check_work(result, watch, what, hits=hits)


def test_5d_freed_cached_blocks_are_evicted_least_recently_used_first(student):
    """A freed block keeps its cached tokens until allocate() needs it, least recently freed first; a hit
    on a freed block takes it back from the free list."""
    allocator = student.BlockAllocator(4, block_size=2)
    blocks = [allocator.allocate() for _ in range(4)]
    for i, block in enumerate(blocks):
        allocator.cache(block, f"hash {i}")
    order = [blocks[2], blocks[0], blocks[3], blocks[1]]
    for block in order:
        allocator.free(block)
    assert all(allocator.cached_block(f"hash {i}") == b for i, b in enumerate(blocks)), "freed blocks keep their cached tokens"
    first = allocator.allocate()
    assert first == order[0] and allocator.cached_block("hash 2") is None and allocator.cached_block("hash 0") == blocks[0], (
        f"blocks were freed in the order {order}; allocate() gave {first} and the cache now maps hash 2 to "
        f"{allocator.cached_block('hash 2')}: the least recently freed block goes first, and its cached tokens are forgotten "
        f"({HINTS}, BlockAllocator.allocate, hint 3).")
    allocator.share(blocks[0])  # a prefix hit on a freed block: it is taken back
    assert allocator.ref_counts[blocks[0]] == 1 and allocator.num_free_blocks == 2
    got = [allocator.allocate(), allocator.allocate()]
    assert got == [order[2], order[3]], (
        f"after a hit took block {blocks[0]} back, allocate() gave {got}; expected {[order[2], order[3]]}: a block in use "
        f"is never handed out ({HINTS}, BlockAllocator.share, hint 1).")


def test_5d_an_evicted_block_forgets_its_hash_both_ways(student):
    """Eviction forgets the hash in both directions: the evicted block, handed out again, can cache new tokens
    under a new hash (and be hit there once freed), and its old hash finds nothing."""
    allocator = student.BlockAllocator(2, block_size=2)
    blocks = [allocator.allocate() for _ in range(2)]
    for i, block in enumerate(blocks):
        allocator.cache(block, f"old {i}")
    for block in blocks:
        allocator.free(block)
    evicted = allocator.allocate()  # both free blocks cache a prefix: the least recently freed is evicted
    assert evicted == blocks[0] and allocator.cached_block("old 0") is None, (
        f"allocate() on a pool whose free blocks all cache a prefix gave {evicted} (freed first: {blocks[0]}) and hash 'old 0' "
        f"still finds {allocator.cached_block('old 0')} ({HINTS}, BlockAllocator.allocate, hint 3).")
    allocator.cache(evicted, "new")  # the reserve of a request that fills the block with other tokens
    assert allocator.cached_block("new") == evicted, (
        f"block {evicted} was evicted (its old hash forgotten), handed out again, and filled with new tokens, but "
        f"cache({evicted}, 'new') did not take: cached_block('new') is {allocator.cached_block('new')}. Eviction must forget "
        f"the hash in BOTH dicts, self.hash_of_block as well as self.block_of_hash: a block still listed with its old hash "
        f"can never cache its new tokens ({HINTS}, BlockAllocator.allocate, hint 3).")
    allocator.free(evicted)
    allocator.share(evicted)  # a hit on its new tokens while it is free: allowed, it caches them
    assert allocator.ref_counts[evicted] == 1 and allocator.num_free_blocks == 1


def test_5d_sharing_a_free_block_that_caches_nothing_is_refused(student):
    """share() of a free block that caches no tokens is a bug (nobody's tokens are there): ValueError, for a block
    never handed out and for one freed without a hash; the pool is unchanged."""
    allocator = student.BlockAllocator(4, block_size=2)
    used = allocator.allocate()
    allocator.free(used)  # free again, caching nothing
    never = next(b for b in range(4) if b != used)
    for block, what in ((never, "never handed out"), (used, "freed, caching nothing")):
        with pytest.raises(ValueError):
            allocator.share(block)
        assert allocator.ref_counts[block] == 0 and allocator.num_free_blocks == 4, (
            f"share({block}) of a free block {what} changed the pool: ref count {allocator.ref_counts[block]}, "
            f"{allocator.num_free_blocks} of 4 free. Only a free block that still caches tokens (a prefix-cache hit) may be "
            f"shared; any other is a ValueError ({HINTS}, BlockAllocator.share, hint 1).")
    assert sorted(allocator.allocate() for _ in range(4)) == [0, 1, 2, 3], "after the refused shares, every block must still be free."


def test_5d_blocks_needed_counts_the_copy_a_write_will_make(student, seed):
    """After a fork, blocks_needed(k) is exactly what append(k) then takes from the pool, for the first
    writer (a shared, partly filled last block is copied: one block more) and for the one after it (the
    block is its own again), at lengths around block edges."""
    rng = random.Random(seed)
    bs = rng.choice([4, 8])
    lengths = sorted({1, bs - 1, bs, bs + 1, 2 * bs, *(rng.randrange(1, 3 * bs + 2) for _ in range(3))} - {0})
    for length in lengths:
        for k in sorted({1, rng.randrange(2, bs + 2), bs + 1}):
            allocator = student.BlockAllocator(16, block_size=bs)
            parent = student.BlockTable(bs)
            parent.append(length, allocator)
            child = parent.fork(allocator)
            for name, table in (("the child (first to write)", child), ("the parent (after the child's write)", parent)):
                predicted, free = table.blocks_needed(k, allocator), allocator.num_free_blocks
                table.append(k, allocator)
                taken = free - allocator.num_free_blocks
                partial = length % bs != 0
                assert predicted == taken, (
                    f"block size {bs}: a {length}-token table (last block {'partly filled' if partial else 'full'}) was forked; "
                    f"then {name}: blocks_needed({k}) said {predicted}, append({k}) took {taken} blocks from the pool. "
                    + ("A write into a shared, partly filled last block copies it first: that copy is a block too, and the "
                       "scheduler that trusts blocks_needed runs into NoFreeBlocks without it. " if partial and predicted < taken else "")
                    + f"blocks_needed must count every block append will allocate ({HINTS}, BlockTable.blocks_needed, hint 1).")
            child.free(allocator)
            parent.free(allocator)
            assert allocator.num_free_blocks == 16, f"after freeing both tables, {16 - allocator.num_free_blocks} blocks are still owned."


def pressure_workload(module, model, seed):
    """Seeded varied requests for a small pool: a few share a prefix, some ask for n = 2 or 3 sampled
    continuations (temperature, top-k, top-p, repetition penalty mixed), arrivals staggered. Returns
    (requests, engine options)."""
    rng = random.Random(seed)
    max_batch_size, bs = rng.choice([2, 3]), 4
    prefixes = sample_prompts(model, 2, 8, 17, seed + 70)
    tails = sample_prompts(model, 8, 1, 10, seed + 71)
    requests = []
    for i, tail in enumerate(tails):
        prefix = rng.choice(prefixes + [[]])
        n = rng.choice([1, 1, 2, 3][:max_batch_size + 1])
        sampled = n > 1 or rng.random() < 0.3
        # A small top-k on every sampled row: among thousands of kept tokens of tiny probability, the last bits of float
        # arithmetic (batched or alone) would move a draw from one token to the next; among a few kept tokens they cannot.
        sampling = SamplingParams(temperature=rng.choice([0.7, 1.0, 1.3]), top_k=rng.choice([5, 10, 20]), top_p=rng.choice([1.0, 0.9]),
                                  repetition_penalty=rng.choice([1.0, 1.3]), seed=seed * 100 + i) if sampled else reference.GREEDY
        requests.append(module.Request(prefix + tail, rng.randrange(3, 15), arrival_step=rng.randrange(0, 16), n=n, sampling=sampling))
    largest = max(math.ceil((len(r.prompt_ids) + r.max_new_tokens - 1) / bs) for r in requests)
    options = dict(block_size=bs, num_blocks=largest + rng.randrange(0, 4), enable_prefix_caching=rng.random() < 0.7,
                   max_num_batched_tokens=rng.choice([max_batch_size, 6, 10]))
    return requests, max_batch_size, options


def check_sequences(result, requests, model, tokenizer, what):
    """Every continuation finished once, with the tokens it gets apart: a greedy one as exercise 2's
    reference alone, a sampled continuation i as a request of its own with seed + i in the reference
    engine (one run for all of them: a request's draws depend on its seed, never on its neighbours)."""
    expected = [(request, i) for request in requests for i in range(request.n)]
    assert len(result.sequences) == len(expected), (
        f"{what}: {len(result.sequences)} sequences for {len(expected)} continuations (each request's n, in order).")
    assert sorted(result.finish_order) == list(range(len(expected))), (
        f"{what}: finish_order {sorted(result.finish_order)} should name every continuation once.")
    sampled = [(request, i) for request, i in expected if not (request.sampling.greedy and request.sampling.repetition_penalty == 1)]
    apart = {}
    if sampled:
        params = [dataclasses.replace(request.sampling, seed=request.sampling.seed + i) for request, i in sampled]
        runs = reference.generate(model, [reference.Request(request.prompt_ids, request.max_new_tokens, sampling=p)
                                          for (request, _), p in zip(sampled, params)], 16, eos_token_id=NO_EOS)
        apart = {(id(request), i): (out, p.seed) for (request, i), p, out in zip(sampled, params, runs.outputs)}
    for seq, (request, i) in zip(result.sequences, expected):
        where = (f"{what}: sequence {seq.id} (continuation {i} of a request with n={request.n}, prompt of {len(request.prompt_ids)} "
                 f"tokens, max_new_tokens={request.max_new_tokens}, preempted {seq.preemptions} times)")
        assert seq.finished_step >= 0, f"{where} never finished: a preempted sequence resumes ({HINTS}, Engine.preempt, hint 1)."
        if (id(request), i) not in apart:
            problem = compare_with_alone(seq.output_ids, model, request.prompt_ids, request.max_new_tokens, tokenizer, NO_EOS)
            assert problem is None, f"{where} differs from the request alone.\n{problem}"
            continue
        want, own_seed = apart[(id(request), i)]
        first = next((k for k, (a, b) in enumerate(zip(seq.output_ids, want)) if a != b), min(len(seq.output_ids), len(want)))
        assert seq.output_ids == want, (
            f"{where} got {seq.output_ids}; as a request of its own with seed {own_seed} it gets {want}: they part at output "
            f"token {first} ({tokenizer.decode(seq.output_ids[first:first + 1])!r} instead of {tokenizer.decode(want[first:first + 1])!r}). "
            f"A continuation samples with its own generator and its own tokens as history, from its own logits row, whatever "
            f"runs beside it ({HINTS}, Engine.step, hint 3).")


def test_5d_seats_and_blocks_hold_under_pressure(student, model, tokenizer, seed):
    """Seeded varied workloads on a small pool: n > 1, chunked prefill, prefix caching, preemption.
    After every step: no block leaked or owned twice, never more than max_batch_size sequences; no
    NoFreeBlocks; every continuation finishes with the tokens it gets alone."""
    requests, max_batch_size, options = pressure_workload(student, model, seed)
    result, _, what = run(student, model, requests, max_batch_size, **options)
    what += (f" on {len(requests)} requests with n = {[r.n for r in requests]}, arriving at steps "
             f"{[r.arrival_step for r in requests]} ({result.stats.preemptions} preemptions)")
    check_sequences(result, requests, model, tokenizer, what)


def test_5d_scheduler_counts_every_seat_and_block(student, model, tokenizer, seed):
    """Three scripted moments of pressure (blocks of 4, random tokens): a request with n=2 whose prompt is
    computed in chunks beside another request, at max_batch_size=2; a fork's first write into the shared,
    partly filled last block with no block free; a newcomer whose prefix hits are free cached blocks when
    the pool has fewer free blocks than its hits and its new blocks together."""
    rng = random.Random(seed)
    long, other = sample_prompts(model, 2, 30, 40, seed + 80)
    # 1. Seats: the n=2 prompt takes several steps; its fork joins when it is done; the other must not take its seat.
    requests = [student.Request(long, 6, n=2, sampling=SamplingParams(top_k=10, seed=seed)), student.Request(other[:8], 6)]
    result, _, what = run(student, model, requests, 2, max_num_batched_tokens=rng.choice([8, 12, 16]))
    check_sequences(result, requests, model, tokenizer, what + " (n=2 beside another request)")
    # 2. Copy-on-write at a full pool: after the prompt (4k + 1..3 tokens), both continuations share a partly filled
    #    last block and the pool has no free block: the first write needs one (preempt), it must not be scheduled blind.
    length = 4 * rng.randrange(2, 5) + rng.randrange(1, 4)
    prompt, new = sample_prompts(model, 1, length, length, seed + 81)[0], rng.randrange(2, 4)
    requests = [student.Request(prompt, new, n=2, sampling=SamplingParams(top_k=10, seed=seed))]
    result, _, what = run(student, model, requests, 2, block_size=4, num_blocks=math.ceil((length + new - 1) / 4))
    check_sequences(result, requests, model, tokenizer, what + f" (n=2, a prompt of {length} tokens filling the pool)")
    # 3. Revived prefix hits: A (9 tokens) finishes at once and leaves two full blocks cached but free; C keeps 4 of
    #    the 7 blocks; B, whose first 8 tokens are A's, hits those two free blocks and needs 2 more: 3 are free, and
    #    sharing its hits takes 2 of them off the free list, so B must wait for C.
    a, c, tail = sample_prompts(model, 1, 9, 9, seed + 82)[0], sample_prompts(model, 1, 12, 12, seed + 83)[0], \
        sample_prompts(model, 1, 5, 5, seed + 84)[0]
    requests = [student.Request(a, 1), student.Request(c, 9), student.Request(a[:8] + tail, 3, arrival_step=1)]
    result, _, what = run(student, model, requests, 2, block_size=4, num_blocks=7, enable_prefix_caching=True)
    check_sequences(result, requests, model, tokenizer, what + " (a newcomer whose prefix hits are free cached blocks)")


# ----------------------------------------------------------------------------------------------
# 5e: beam search on the block manager

BEAM_STEPS = 12
BEAM_BLOCK_SIZE = 4


def beam_stories(seed):
    """Two seeded random beam searches over a prompt: one of width 1 (one child a step, never a copy) and
    one of width 2 to 4 where per step each new beam extends an old one, unsorted (a good beam has several
    children, a bad one none), and now and then fewer new beams than old remain (beams that finish leave
    the search). Yields (prompt, parents per step)."""
    rng = random.Random(seed)
    for width in (1, rng.choice([2, 3, 4])):
        yield beam_story(rng, width)


def beam_story(rng, width):
    prompt = [rng.randrange(1000) for _ in range(rng.randrange(1, 14))]
    story, live = [], 1
    # A step where beams finish for sure (fewer new beams than the full width before), when every beam's last block is
    # full: the pruned beams' blocks go back while each new beam takes a new block.
    shrink = rng.choice([s for s in range(2, BEAM_STEPS) if (len(prompt) + s) % BEAM_BLOCK_SIZE == 0])
    for step in range(BEAM_STEPS):
        k = width if rng.random() < 0.6 or step == shrink - 1 else rng.randint(1, width)
        if step == shrink and width > 1:
            k = rng.randint(1, width - 1)
        story.append([rng.randrange(live) for _ in range(k)])
        live = k
    return prompt, story


def counted(n, one, many=None):
    return f"{n} {one if n == 1 else many or one + 's'}"


def beams_need(histories, bs):
    """The blocks beams with these token histories need at the least: each full block once (shared by
    every beam that descends from it) and one partly filled block each."""
    full = {tuple(h[:k * bs]) for h in histories for k in range(1, len(h) // bs + 1)}
    return len(full) + sum(len(h) % bs != 0 for h in histories)


def run_beam_search(student, prompt, story, tight):
    """Beams over a prompt, pruned and extended as the story says, their tokens written through the
    copies and slots that beam_step gives. After every step: every beam reads back its own tokens, the
    pool holds exactly the blocks the live beams need, ref counts are the holders, and the step made no
    more copies than it must. tight: each step runs on the smallest pool the reference runs it on (the
    larger of the blocks the old beams hold and those the new beams need; the rest of the pool is taken)."""
    bs, num_blocks = BEAM_BLOCK_SIZE, 48
    allocator = student.BlockAllocator(num_blocks, block_size=bs)
    store = [None] * (num_blocks * bs)  # the pool's slots, holding token ids instead of keys and values
    table = student.BlockTable(bs)
    table.append(len(prompt), allocator)
    for p, token in enumerate(prompt):
        store[table.blocks[p // bs] * bs + p % bs] = token
    tables, histories = [table], [prompt]
    pool = "the smallest pool it fits (the rest of the 48 blocks taken)" if tight else "a pool of 48"
    for step, parents in enumerate(story):
        where = (f"beam search on {pool}, prompt of {plural(len(prompt), 'token')}, blocks of {bs}, step {step} (new beams' parents per "
                 f"step: {story[:step + 1]})")
        before = [list(t.blocks) for t in tables]
        held = beams_need(histories, bs)
        new_histories = [histories[p] + [10000 + 10 * step + j] for j, p in enumerate(parents)]  # distinct: each beam its own token
        needed = beams_need(new_histories, bs)
        children = {p: parents.count(p) for p in set(parents)}
        minimum = sum(k - 1 for p, k in children.items() if len(histories[p]) % bs)
        shapes = [f"old beam {p}: {k} {'children' if k > 1 else 'child'}, last block {len(histories[p]) % bs or bs} of {bs} full"
                  for p, k in sorted(children.items())]
        taken = []
        if tight:  # the reference never holds more than max(held, needed) blocks during a step: leave only that
            room = max(held, needed) - (num_blocks - allocator.num_free_blocks)
            taken = [allocator.allocate() for _ in range(max(0, allocator.num_free_blocks - max(0, room)))]
        try:
            tables, copies = student.beam_step(tables, parents, allocator)
        except Exception as error:
            if not tight or type(error).__name__ != "NoFreeBlocks":
                raise
            raise AssertionError(
                f"{where}: beam_step ran out of blocks ({type(error).__name__}: {error}). The checker held the rest of the pool "
                f"and left {max(held, needed)} blocks to the search: the {counted(len(before), 'old beam')} held "
                f"{counted(held, 'block')}, the {counted(len(parents), 'new beam')} need {needed}, and the reference never needs "
                f"more than the larger of the two during a step. Let every old table go first (a pruned beam's blocks go back to "
                f"the pool before any new block is taken), and copy only a shared, partly filled block: an only child writes "
                f"into its parent's last block in place ({HINTS}, beam_step, hints 2 and 3).") from None
        for block in taken:
            allocator.free(block)
        tables, copies = list(tables), list(copies or [])
        assert len(tables) == len(parents), f"{where}: beam_step returned {len(tables)} tables for {len(parents)} new beams."
        for src, dst in copies:
            store[dst * bs:(dst + 1) * bs] = store[src * bs:(src + 1) * bs]
        histories = new_histories
        for t, history in zip(tables, histories):
            assert t.num_tokens == len(history) and len(t.blocks) == math.ceil(len(history) / bs), (
                f"{where}: a new beam of {plural(len(history), 'token')} has a table of {t.num_tokens} tokens in {len(t.blocks)} blocks: it "
                f"holds its parent's tokens and a slot for its new one ({HINTS}, beam_step, hint 1).")
            p = len(history) - 1
            store[t.blocks[p // bs] * bs + p % bs] = history[-1]
        for j, (t, history) in enumerate(zip(tables, histories)):
            read = [store[t.blocks[p // bs] * bs + p % bs] for p in range(len(history))]
            wrong = next((p for p, (a, b) in enumerate(zip(read, history)) if a != b), None)
            assert wrong is None, (
                f"{where}: beam {j} (child of old beam {parents[j]}, whose blocks were {before[parents[j]]}) reads token {read[wrong]} "
                f"at position {wrong} instead of {history[wrong]}: "
                + ("another beam's write landed in a block they share: a shared, partly filled block is copied before a write "
                   "(copy-on-write), and the copies are returned so the cache makes them first"
                   if wrong >= len(history) - bs else "a block it still needed was handed to another beam: fork before you free")
                + f" ({HINTS}, beam_step, hint 2).")
        owners = [0] * num_blocks
        for t in tables:
            for block in t.blocks:
                owners[block] += 1
        in_use = num_blocks - allocator.num_free_blocks
        assert list(allocator.ref_counts) == owners and in_use == needed, (
            f"{where}: {in_use} blocks are owned, ref counts of the owned ones "
            f"{[(b, c) for b, c in enumerate(allocator.ref_counts) if c][:8]}, held by the beams {[(b, o) for b, o in enumerate(owners) if o][:8]}; "
            f"the {len(parents)} beams need {needed}: each full block once, shared by every beam that descends from it, and one "
            f"partly filled block each. "
            + ("Every old beam no new beam extends is pruned, whether the search keeps its width or beams finish and fewer new "
               "beams than old remain: it must give its blocks back, and every old table lets go of its share. "
               if in_use > needed else "")
            + f"({HINTS}, beam_step, hint 1).")
        assert len(copies) <= minimum, (
            f"{where}: beam_step made {counted(len(copies), 'block copy', 'block copies')} {copies[:6]}; this step needs {minimum}. Only a parent whose last "
            f"block is partly filled and which has k > 1 children needs copies: k - 1 of them, one child keeping the block "
            f"({'; '.join(shapes)}). "
            f"An only child writes into its parent's last block in place, and a full last block is never written. A write "
            f"sees a shared block (and copies it) when the old tables still hold their share: let them go before the "
            f"new beams append ({HINTS}, beam_step, hints 2 and 3).")
    for t in tables:
        t.free(allocator)
    assert allocator.num_free_blocks == num_blocks and not any(allocator.ref_counts), (
        f"after freeing the last beams, {num_blocks - allocator.num_free_blocks} blocks are still owned: a block leaked.")


def test_5e_beam_search_shares_copies_and_frees(student, seed):
    """Beams of two seeded random searches (width 1; width 2 to 4 with beams pruned and finishing) on a roomy pool:
    every beam reads back its own tokens, the pool holds exactly the blocks the live beams need (full
    blocks shared along the beam tree, one partly filled block each), ref counts are the holders, a step
    copies no more blocks than it must (a parent's partly filled last block, once per child but one),
    and nothing is left once the beams are freed."""
    for prompt, story in beam_stories(seed):
        run_beam_search(student, prompt, story, tight=False)


def test_5e_beam_search_runs_on_the_smallest_pool(student, seed):
    """The same searches, each step on the smallest pool the reference runs it on: the rest of the pool is
    taken before the step, leaving the larger of what the old beams hold and what the new beams need. A
    step that takes new blocks before the pruned beams give theirs back, or copies a block it could
    write in place, runs out of blocks."""
    for prompt, story in beam_stories(seed):
        run_beam_search(student, prompt, story, tight=True)


# ----------------------------------------------------------------------------------------------
# Differential checks: the reference is the oracle (workshop/grading/differential.py). Generated scenarios drive
# your module and the reference through the same calls; after every call the observer reads what the stub
# promises from both, and the two readings must agree. Block ids are compared only where the stub promises
# them (the allocator's own calls: the block free the longest goes first); elsewhere a table's blocks are read
# as their sharing structure (the first block seen is 0, the next new one 1, ...) and slots relative to their table.

BLOCK_SIZES = [1, 2, 3, 4, 5, 6, 8]  # powers of two and not: block * bs | offset equals + only for powers of two
FLOAT_TOL = Tolerance(rtol=1e-4, atol=1e-4)  # float32 attention summed in another order (per sequence, other layouts)
DIFF_HINTS = {
    "5a": f"Hint: {HINTS}, sections BlockAllocator.allocate/.share/.free and BlockTable.blocks_needed/.append/.slot_mapping/.fork.",
    "5b": f"Hint: {HINTS}, sections PagedKVCache.write, pack and paged_attention.",
    "5c": f"Hint: {HINTS}, sections Engine.schedule, Engine.preempt and Engine.step.",
    "5d": f"Hint: {HINTS}, sections block_hashes, Engine.prefix_hits, BlockTable.fork and Engine.step (hint 3: the forks).",
    "5e": f"Hint: {HINTS}, section beam_step.",
}


@dataclasses.dataclass(frozen=True)
class Raised:
    """A call that raised one of the contract's errors (NoFreeBlocks, ValueError), read as its class name."""
    kind: str


def attempt(fn):
    """fn, with the contract's errors read as Raised(class name), so that a NoFreeBlocks the reference does not
    raise shows as a divergence after the calls that led there (a TODO left undone still raises)."""
    def run(side, *args):
        try:
            return fn(side, *args)
        except NotImplementedError:
            raise
        except (ValueError, RuntimeError) as error:  # NoFreeBlocks is a RuntimeError
            return Raised(type(error).__name__)
    return run


class Side(types.SimpleNamespace):
    """One side's objects in a scenario: the module (reference or yours) and what was built from it."""


class Labels(dict):
    """Block ids read as their structure: the first block seen reads 0, the next new one 1, ..."""

    def __call__(self, block):
        return None if block is None else self.setdefault(block, len(self))


def lru_evicts_past_an_empty_block(allocator, k):
    """The reference's allocator, about to hand out k blocks: would it evict a cached free block while a free block
    caching nothing waits behind it? A design that spares cached blocks (tests/alternatives/ex5_other_design.py)
    hands out the empty one there; the checks do not go where the two designs part."""
    free = list(allocator.free_blocks)
    spared = [b for b in free if b not in allocator.hash_of_block] + [b for b in free if b in allocator.hash_of_block]
    return free[:k] != spared[:k]


# -- 5a: the allocator and block tables, stateful

@functools.lru_cache(maxsize=None)
def pool_ops(bs, sharing):
    """The calls of a pool scenario at block size bs (built once per block size: building strategies is slow). Without
    sharing, only 5a's calls: no cache, fork or prefix hit, so that no table block is ever shared (no copy-on-write)."""
    tokens = around(1, bs, 2 * bs, low=0, high=3 * bs + 1)
    table, index = st.integers(0, 7), st.integers(0, 11)
    calls = [st.tuples(st.just("allocate")), st.tuples(st.just("share"), index), st.tuples(st.just("free"), index),
             st.tuples(st.just("table")), st.tuples(st.just("append"), table, tokens), st.tuples(st.just("append"), table, tokens),
             st.tuples(st.just("needed"), table, tokens), st.tuples(st.just("slots"), table, st.integers(0, 40), st.integers(0, 40)),
             st.tuples(st.just("release"), table)]
    if sharing:  # 5d: prefix caching and forks
        calls += [st.tuples(st.just("cache"), index, st.integers(0, 3)), st.tuples(st.just("fork"), table),
                  st.tuples(st.just("remember"), table, st.integers(0, 2)),
                  st.tuples(st.just("adopt"), st.integers(0, 2), st.integers(1, 4))]
    return st.lists(st.one_of(*calls), min_size=6, max_size=40)


@st.composite
def pool_scenarios(draw, sharing):
    """Two pools used in turn (state shared between instances shows): A under raw allocate/share/free calls, errors
    included (exhausted pool, double free); B under block tables: appends of 0, 1, bs +- 1 and 2 * bs +- 1 tokens,
    slot mappings at block edges, frees. With sharing (5d), also: A's cache calls and shares of free blocks (refused
    unless cached); B's forks, blocks cached under chained keys and tables started from those cached blocks (prefix
    hits, revived from the free list)."""
    bs = draw(st.sampled_from(BLOCK_SIZES))
    sizes = (draw(st.integers(1, 5)), draw(POOL_B_SIZES))
    return bs, sizes, draw(pool_ops(bs, sharing))


POOL_B_SIZES = around(4, 8, low=1, high=12)


def observe_pools(hashes, keys):
    """Pool A as the stub promises it, ids included (ref counts per block, free count, the block each hash names);
    pool B's tables as structure: tokens, block labels and their ref counts, the block each key names, the free
    count and the ref counts as a multiset."""
    def observe(side):
        a, b = side.a, side.b
        label = Labels()
        tables = [(t.num_tokens, [label(x) for x in t.blocks], [b.ref_counts[x] for x in t.blocks]) for t in side.tables]
        return {"A": {"free blocks": a.num_free_blocks, "ref counts": list(a.ref_counts), "cached_block": [a.cached_block(h) for h in hashes]},
                "B": {"free blocks": b.num_free_blocks, "ref counts (multiset)": sorted(c for c in b.ref_counts if c), "tables": tables,
                      "cached_block": [(label(b.cached_block(k)), b.ref_counts[b.cached_block(k)] if b.cached_block(k) is not None else None)
                                       for k in keys]}}
    return observe


def relative_copies(table, copies):
    """append's copies [(src, dst)] read against the table: dst should be its own last block now."""
    if not isinstance(copies, list):
        return f"a {type(copies).__name__}"
    return [(src in table.blocks, table.blocks.index(dst) if dst in table.blocks else "not in the table") for src, dst in copies]


def relative_slots(table, slots):
    """slot_mapping's slots read against the table: (which of its blocks, offset), each a Python int."""
    if not isinstance(slots, list):
        return f"a {type(slots).__name__}, not a list"
    bs = table.block_size
    return [(table.blocks.index(s // bs) if s // bs in table.blocks else "not in the table", s % bs) if type(s) is int
            else f"a {type(s).__name__}, not an int" for s in slots]


def test_5a_differential_blocks(student, seed):
    """Generated sequences of 5a's allocator and block-table calls on two pools at once, the same on yours and the
    reference, observed after every call: returned values and their types (block ids, blocks_needed, copies,
    slot mappings relative to the table), free counts, ref counts, each table's tokens and blocks; the error class
    of an exhausted pool and a double free, and the state after the refusal (unchanged). Nothing is shared between
    tables here: forks, copy-on-write and prefix caching are test_5d_differential_blocks'."""
    check_pools(student, seed, sharing=False)


def test_5d_differential_blocks(student, seed):
    """As test_5a_differential_blocks, with 5d's calls too: forks (then blocks_needed and append on shared blocks:
    copy-on-write), blocks cached under hashes and chained keys, evicted when handed out again, tables started from
    cached blocks (prefix hits revived from the free list), and the refused share of a free block caching nothing."""
    check_pools(student, seed, sharing=True)


def check_pools(student, seed, sharing):
    def check(scenario):
        bs, (size_a, size_b), ops = scenario
        hashes, keys = [], []
        twins = Twins(Side(mod=reference, tables=[]), Side(mod=student, tables=[]), observe_pools(hashes, keys),
                      hint=DIFF_HINTS["5d" if sharing else "5a"])

        def build(side):
            side.a, side.b = side.mod.BlockAllocator(size_a, block_size=bs), side.mod.BlockAllocator(size_b, block_size=bs)
            side.tables.append(side.mod.BlockTable(bs))
        twins.call(f"A = BlockAllocator({size_a}, block_size={bs}); B = BlockAllocator({size_b}, block_size={bs}); "
                   f"tables = [BlockTable({bs})]", build)
        ref = twins.reference

        def call(what, fn):  # a call the reference refuses returns None: the state after it must be unchanged too
            twins.call(what, fn) or twins.check("the state after the refused call")
        for op, *args in ops:
            tables = len(ref.tables)
            t = args[0] % tables if tables and op in ("append", "needed", "slots", "fork", "release", "remember") else None
            if op == "allocate" and not lru_evicts_past_an_empty_block(ref.a, 1):
                call("A.allocate()", lambda s: s.a.allocate())
            elif op == "free" or op == "share" and (sharing or ref.a.ref_counts[args[0] % size_a]):  # a free block's share is 5d's
                block = args[0] % size_a
                call(f"A.{op}({block})", lambda s: getattr(s.a, op)(block))
            elif op == "cache" and any(ref.a.ref_counts):
                block = [b for b in range(size_a) if ref.a.ref_counts[b]][args[0] % sum(map(bool, ref.a.ref_counts))]
                hashes.append(f"h{args[1]}")
                call(f"A.cache({block}, 'h{args[1]}')", lambda s: s.a.cache(block, hashes[-1]))
            elif op == "table":
                call(f"tables.append(BlockTable({bs}))", lambda s: s.tables.append(s.mod.BlockTable(bs)))
            elif op in ("append", "needed") and t is not None:
                n, need = args[1], ref.tables[t].blocks_needed(args[1], ref.b)
                call(f"tables[{t}].blocks_needed({n}, B)", lambda s: s.tables[t].blocks_needed(n, s.b))  # as the scheduler asks first
                if op == "append" and need <= ref.b.num_free_blocks and not lru_evicts_past_an_empty_block(ref.b, need):
                    call(f"tables[{t}].append({n}, B)", lambda s: relative_copies(s.tables[t], s.tables[t].append(n, s.b)))
            elif op == "slots" and t is not None:
                held = ref.tables[t].num_tokens
                start = args[1] % (held + 1)
                end = start + args[2] % (held - start + 1)
                call(f"tables[{t}].slot_mapping({start}, {end})", lambda s: relative_slots(s.tables[t], s.tables[t].slot_mapping(start, end)))
            elif op == "fork" and t is not None:
                call(f"tables.append(tables[{t}].fork(B))", lambda s: s.tables.append(s.tables[t].fork(s.b)))
                for n in (0, 1):  # what a write would take now that the blocks are shared (a partly filled one is copied)
                    call(f"tables[{len(ref.tables) - 1}].blocks_needed({n}, B)", lambda s: s.tables[-1].blocks_needed(n, s.b))
            elif op == "release" and t is not None:
                call(f"tables[{t}].free(B)", lambda s: s.tables[t].free(s.b))
            elif op == "remember" and t is not None:  # the engine's reserve caches the full blocks a sequence fills
                full, key = ref.tables[t].num_tokens // bs, args[1]
                keys.extend((key, i) for i in range(full) if (key, i) not in keys)
                call(f"B.cache(tables[{t}].blocks[i], (key {key}, i)) for its {full} full blocks",
                           lambda s: [s.b.cache(x, (key, i)) for i, x in enumerate(s.tables[t].blocks[:full])] and None)
            elif op == "adopt":  # a prefix hit: share the cached blocks of key 0, 1, ... up to the first miss
                key, most = args

                def adopt(s):
                    hits = []
                    for i in range(most):
                        if s.b.cached_block((key, i)) is None:
                            break
                        hits.append(s.b.cached_block((key, i)))
                    for x in hits:
                        s.b.share(x)
                    s.tables.append(s.mod.BlockTable(bs, hits))
                call(f"tables.append(BlockTable({bs}, hits)) after B.share(hit) of each cached block of key {key}, up to {most}", adopt)

    explore(pool_scenarios(sharing), check, seed=seed, examples=100, edges=SHARING_POOL_EDGES if sharing else POOL_EDGES)


# Tried first at every seed (issue 41): a pool A of one block exhausted, a double free; appends of exactly a block, one
# past it, then up to exactly two, a request for more than the free blocks, slot mappings over the whole table and from
# inside a block; a table filling all of B, an append of 0. At block size 1: shares of a held block, then more frees
# than shares.
POOL_EDGES = [
    (4, (1, 3), [("allocate",), ("allocate",), ("free", 0), ("free", 0), ("append", 0, 4), ("needed", 0, 1), ("append", 0, 1),
                 ("slots", 0, 0, 5), ("slots", 0, 3, 2), ("append", 0, 9), ("append", 0, 3), ("release", 0), ("table",),
                 ("append", 1, 12), ("append", 1, 0), ("slots", 1, 12, 0)]),
    (1, (2, 1), [("append", 0, 1), ("append", 0, 1), ("slots", 0, 0, 1), ("allocate",), ("share", 0), ("free", 0), ("free", 0),
                 ("free", 0)]),
]
# With sharing (5d): a cached block freed, then shared from the free list (revived) beside a share of a free block
# caching nothing (refused); a fork of a partly filled table, then an append on it (copy-on-write); both tables freed,
# then a prefix hit on the cached block, revived from the free list.
SHARING_POOL_EDGES = [
    (2, (2, 4), [("allocate",), ("cache", 0, 1), ("free", 0), ("share", 0), ("share", 1), ("append", 0, 3), ("remember", 0, 0),
                 ("fork", 0), ("append", 1, 1), ("release", 0), ("release", 1), ("adopt", 0, 4), ("append", 2, 2)]),
]


# -- 5d: block hashes, as structure

@st.composite
def hash_scenarios(draw):
    """Token lists at one block size: prefixes of one list at lengths 0, 1, bs +- 1, 2 * bs +- 1, ..., the same
    list with one token changed, with two blocks swapped, one block repeated, <|endoftext|> and edge ids inside."""
    bs = draw(st.sampled_from(BLOCK_SIZES))
    base = draw(st.lists(token_ids(), min_size=4 * bs + 1, max_size=4 * bs + 1))
    lists = [base[:n] for n in draw(st.lists(around(bs, 2 * bs, 3 * bs, low=0, high=4 * bs + 1), min_size=1, max_size=4))]
    changed = list(base)
    changed[draw(st.integers(0, len(base) - 1))] = draw(token_ids())
    i, j = sorted(draw(st.lists(st.integers(0, 3), min_size=2, max_size=2, unique=True)))
    swapped = base[:i * bs] + base[j * bs:(j + 1) * bs] + base[(i + 1) * bs:j * bs] + base[i * bs:(i + 1) * bs] + base[(j + 1) * bs:]
    return bs, lists + [base, changed, swapped, base[:bs] * 3]


def hash_structure(lists, hashes):
    """The hashes of several token lists read as structure: equal hashes read as one label (the first seen is 0)."""
    label = Labels()
    return [f"a {type(h).__name__}, not a list" if not isinstance(h, list) else [label(x) for x in h] for h in hashes]


def test_5d_differential_block_hashes(student, seed):
    """block_hashes on generated token lists, yours and the reference's read as structure (any hash will do):
    one hash per FULL block, a list, equal exactly where the tokens so far are equal (chained: a changed or
    moved block changes every later hash), the same twice, the token lists unchanged."""
    def check(scenario):
        bs, lists = scenario
        twins = Twins(reference, student, hint=DIFF_HINTS["5d"])
        shown = ", ".join(str(len(tokens)) for tokens in lists)
        twins.call(f"block_hashes(tokens, {bs}) for token lists of {shown} tokens (the same list cut, a token changed, blocks "
                   f"swapped, a block repeated)", lambda m, lists: hash_structure(lists, [m.block_hashes(t, bs) for t in lists]),
                   inputs=(lists,), again=True)

    explore(hash_scenarios(), check, seed=seed, examples=60, edges=HASH_EDGES)


# Tried first at every seed (issue 41): no token, one short of a block, exactly one and two blocks and one past them;
# a token changed in the last, partly filled block (no hash changes), in the first (every hash does); two blocks
# swapped; one block repeated (equal blocks, different hashes). Token ids 0 and EOS inside. At block size 1 too.
_HASHED = [0, 50256, 7, 7, 0, 1, 2, 3, 50256, 50256, 9, 9, 4, 5, 6, 8, 11]
HASH_EDGES = [
    (4, [[], _HASHED[:3], _HASHED[:4], _HASHED[:5], _HASHED[:8], _HASHED[:9], _HASHED, _HASHED[:16] + [12], [1] + _HASHED[1:],
         _HASHED[4:8] + _HASHED[:4] + _HASHED[8:], _HASHED[:4] * 3]),
    (1, [[], [0], [0, 0], [50256, 0]]),
]


# -- 5b: the paged cache and the forward through it

@st.composite
def paged_scenarios(draw):
    """A random model of other sizes, a block size, up to three sequences, each computed in chunks over up to three
    forwards (a prompt of about bs, 2 * bs tokens, then chunks of 1, bs +- 1), one joining late; block tables
    scattered over a pool with spare blocks, some a block longer than they need; the model and cache in a drawn dtype."""
    config = draw(small_config(max_layers=2, n_positions=(16, 32)))
    bs = draw(st.sampled_from(BLOCK_SIZES))
    sequences = []
    for i in range(draw(st.integers(1, 3))):
        chunks = [draw(around(bs, 2 * bs, low=1, high=2 * bs + 1))] + draw(st.lists(around(1, bs, low=1, high=bs + 1), max_size=2))
        while sum(chunks) > config.n_positions:  # the context is the longest a sequence may be
            if len(chunks) > 1:
                chunks.pop()
            else:
                chunks[0] = config.n_positions
        tokens = draw(st.lists(token_ids(), min_size=sum(chunks), max_size=sum(chunks)))
        sequences.append((draw(st.integers(0, 1)) if i else 0, chunks, tokens, draw(st.integers(0, 1))))
    need = sum(-(-len(tokens) // bs) + extra for _, _, tokens, extra in sequences)
    pool = draw(st.permutations(range(need + draw(st.integers(0, 2)))))
    return config, bs, sequences, pool, draw(st.booleans()), draw(dtypes())


def observe_cache(side):
    """The cache read without its layout: per pool (keys and values of every layer), the values written (nonzero
    elements), their sum, and whether it is still the tensor allocated at the start (written in place)."""
    pools = list(side.cache.keys) + list(side.cache.values)
    return [{"nonzero": int(p.count_nonzero()), "sum": float(p.double().sum()), "in place": p is first and p.data_ptr() == ptr}
            for p, (first, ptr) in zip(pools, side.pools)]


def pack_reading(packed):
    """What pack promises whatever PackedBatch holds besides: input_ids, position_ids, the slots, the last indices."""
    input_ids, position_ids, batch = packed
    return {"input_ids": input_ids, "position_ids": position_ids, "slots": batch.slots, "last": batch.last}


def test_5b_differential_paged_forward(student, device, seed):
    """Generated packed steps on random models of other sizes, block sizes 1 to 8 and lengths at block edges: pack's
    tokens, positions, slots and last indices (exact), forward's logits (to 1e-4), the cache after each forward
    read without its layout (values written, their sums, in place), then write and paged_attention called
    directly with random keys, values and queries; the arguments unchanged, no output sharing their storage."""
    def check(scenario):
        config, bs, sequences, pool, reverse, dtype = scenario
        model = small_model(config, device, dtype=dtype)
        tables, at = [], 0
        for _, _, tokens, extra in sequences:
            k = -(-len(tokens) // bs) + extra
            tables.append(list(pool[at:at + k]))
            at += k
        twins = Twins(Side(mod=reference), Side(mod=student), observe_cache, hint=DIFF_HINTS["5b"], tol=tolerance(dtype, FLOAT_TOL))

        def build(side):
            side.cache = side.mod.PagedKVCache(model.config, len(pool), bs, model.device, dtype)
            side.pools = [(p, p.data_ptr()) for p in list(side.cache.keys) + list(side.cache.values)]
        twins.call(f"cache = PagedKVCache({dtype_name(dtype)} model with {config.n_layer} layers, {config.n_head} heads of "
                   f"{config.n_embd // config.n_head}; {len(pool)} blocks of {bs}, dtype={dtype_name(dtype)})", build)
        done = [0] * len(sequences)
        step = 0
        while True:
            active = [i for i, (start, chunks, _, _) in enumerate(sequences) if start <= step < start + len(chunks)]
            if not active:
                break
            if reverse:
                active.reverse()
            new = [sequences[i][2][done[i]:done[i] + sequences[i][1][step - sequences[i][0]]] for i in active]
            starts, step_tables = [done[i] for i in active], [tables[i] for i in active]
            shown = f"tokens of {[len(t) for t in new]} at positions {starts}, block tables {step_tables}"
            twins.call(f"pack({shown}, block_size={bs})", lambda s, *a: pack_reading(s.mod.pack(*a, bs, model.device)),
                       inputs=(new, starts, step_tables), again=True)
            twins.call(f"forward(model, cache, {shown})", lambda s, *a: s.mod.forward(model, s.cache, *a), inputs=(new, starts, step_tables))
            for i, tokens in zip(active, new):
                done[i] += len(tokens)
            step += 1
        # write and paged_attention alone, on the last step's layout, with random keys, values and queries
        generator = torch.Generator().manual_seed(sum(pool) + bs)
        n, heads = sum(len(t) for t in new), config.n_head
        k, v, q = (torch.randn(n, heads, config.n_embd // heads, generator=generator).to(model.device, dtype) for _ in range(3))
        slots = reference.pack(new, starts, step_tables, bs, model.device)[2].slots
        layer = config.n_layer - 1
        twins.call(f"cache.write({layer}, k, v, slots) with random k, v [{n}, {heads}, {config.n_embd // heads}] at the last step's slots",
                   lambda s, k, v, slots: s.cache.write(layer, k, v, slots), inputs=(k, v, slots))
        twins.call(f"paged_attention(random q [{n}, {heads}, {config.n_embd // heads}], cache, {layer}, pack(the last step))",
                   lambda s, q: s.mod.paged_attention(q, s.cache, layer, s.mod.pack(new, starts, step_tables, bs, model.device)[2]),
                   inputs=(q,))

    explore(paged_scenarios(), check, seed=seed, examples=40, edges=PAGED_EDGES)


# Tried first at every seed (issue 41): the whole context in one chunk, exactly four blocks, on a pool of exactly them,
# shuffled; block size 3 (not a power of two), one head, two sequences, the second joining late, chunks of exactly a
# block, one short and one past it, a spare block in a table and in the pool, packed in reverse; block size 1, one token
# on a one-block pool. In float32.
PAGED_EDGES = [
    (gpt.GPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2), 4, [(0, [16], list(range(100, 116)), 0)], [3, 1, 0, 2], False,
     torch.float32),
    (gpt.GPTConfig(n_positions=16, n_embd=4, n_layer=2, n_head=1), 3,
     [(0, [3, 1, 2], [0, 50256, 5, 6, 7, 8], 1), (1, [4, 3], list(range(200, 207)), 0)], [6, 0, 5, 1, 4, 2, 3], True, torch.float32),
    (gpt.GPTConfig(n_positions=16, n_embd=4, n_layer=1, n_head=1), 1, [(0, [1], [0], 0)], [0], False, torch.float32),
]


# -- 5c, 5d: the engine stepped by hand

ENGINE_STEPS = 60  # a cap: the scenarios' requests finish well within it


class Evicted(Exception):
    """The reference's engine is about to take a free block where another design may take another one and so keep
    other blocks cached (the order of the blocks that sequences finishing in one step free, the alternatives'
    allocator that spares cached blocks): the scenario ends there."""


def watch_evictions(side):
    """Wraps the reference's engine: side.evicted turns True before an allocation where designs may part, when the
    block handed out caches tokens while a free block that caches nothing waits behind it (an allocator may spare
    cached blocks), or when it was freed in a step where several sequences finished and another block freed then is
    free too, one of them cached (their order in the free list is the order the step freed them in, a free choice)."""
    engine, freed_in = side.engine, {}
    allocator, step, allocate = engine.allocator, engine.step, engine.allocator.allocate

    def watched_allocate():
        free, cached = list(allocator.free_blocks), allocator.hash_of_block
        if free:
            first = free[0]
            rivals = [b for b in free[1:] if first in freed_in and freed_in.get(b) == freed_in[first]]
            side.evicted |= (first in cached and any(b not in cached for b in free)) or bool(
                rivals and (first in cached or any(b in cached for b in rivals)))
        return allocate()

    def watched_step():
        free, finished = set(allocator.free_blocks), len(engine.finished)
        step()
        if len(engine.finished) - finished > 1:
            freed_in.update({b: engine.step_index for b in allocator.free_blocks if b not in free})
    allocator.allocate, engine.step = watched_allocate, watched_step


@st.composite
def engine_scenarios(draw, sharing):
    """An engine on a random model of other sizes: block size 1 to 8, max_batch_size 1 to 3, a token budget at
    max_batch_size (every running sequence's decode exactly), at bs +- 1 or at a prompt's length (one under
    max_batch_size: refused), a pool of the largest request's blocks +- 1 and a little more (preemption; one short:
    that request is refused), or the default; up to four requests, prompts of 1, bs +- 1, 2 * bs +- 1 tokens, each
    submitted at a generated step, arriving then or later (idle steps) or earlier (a late add); EOS never, the
    default, or the first token request 0 gets. sharing: prefix caching (prompts cut from one token list, so that
    they share blocks), n > 1 continuations (n = max_batch_size + 1 refused), seeded sampling."""
    config = draw(small_config(max_layers=2, n_positions=(24, 32)))
    bs = draw(st.sampled_from(BLOCK_SIZES))
    max_batch = draw(st.sampled_from([2, 3, 1]))
    base = draw(st.lists(token_ids(), min_size=3 * bs, max_size=3 * bs))
    requests = []
    for _ in range(draw(st.integers(2, 4))):
        if sharing and draw(st.integers(0, 3)):  # most prompts start with the same tokens: cached blocks to hit
            prompt = base[:draw(around(bs, 2 * bs, low=bs, high=3 * bs))] + draw(st.lists(token_ids(), max_size=bs + 1))
        else:
            length = draw(around(bs, 2 * bs, low=1, high=3 * bs + 1))
            prompt = draw(st.lists(token_ids(), min_size=length, max_size=length))
        prompt = (prompt or base[:1])[:config.n_positions - 4]
        n = draw(st.sampled_from([1, 1, 2, 3, max_batch + 1])) if sharing else 1
        sampling = reference.GREEDY if not sharing or draw(st.booleans()) else SamplingParams(
            temperature=draw(st.sampled_from([0.8, 1.0])), top_k=draw(st.sampled_from([1, 3, 10])), seed=draw(st.integers(0, 99)))
        requests.append(dict(prompt=prompt, max_new=draw(around(1, bs, low=1, high=6)), arrival=draw(st.integers(0, 4)),
                             submit=draw(st.integers(0, 4)), n=n, sampling=sampling))
    need = max(-(-(len(r["prompt"]) + r["max_new"] - 1) // bs) for r in requests)
    num_blocks = draw(st.sampled_from([need, need + 1, need, max(1, need - 1), need + 2, need + 4, None]))
    budget = draw(st.sampled_from([max_batch, bs, bs + 1, max_batch, bs - 1, len(requests[0]["prompt"]), 512, max_batch - 1]))
    caching = sharing and draw(st.integers(0, 3)) > 0
    budget = budget if budget == max_batch - 1 else max(budget, max_batch)  # under max_batch_size only when meant: refused
    # The model's dtype: drawn where every request is greedy (5c), whose near ties the check can skip; seeded sampling (5d)
    # may flip a token wherever two logits straddle its draw, which no margin bounds: float32 there.
    dtype = torch.float32 if sharing else draw(dtypes())
    return config, bs, max_batch, requests, num_blocks, max(1, budget), caching, draw(st.sampled_from(["never", "default", "first"])), dtype


def engine_reading(side):
    """What the engine promises after a step: each sequence's tokens, computed tokens, table (tokens and block
    structure, None when it owns none), admission, finish, preemptions, prefix hits and forks; who runs, waits and
    has finished, in order; what the last schedule() returned; the stats; the free blocks and ref counts."""
    if side.evicted:
        raise Evicted
    engine, label = side.engine, Labels()

    def table(seq):
        t = seq.block_table
        if t is None or (seq.finished_step >= 0 and not t.blocks):
            return None
        return {"num_tokens": t.num_tokens, "blocks": [label(b) for b in t.blocks]}
    stats = engine.stats
    return {"sequences": [{"id": s.id, "output_ids": s.output_ids, "num_computed": s.num_computed, "block_table": table(s),
                           "admitted_step": s.admitted_step, "finished_step": s.finished_step, "preemptions": s.preemptions,
                           "prefix_hit_tokens": s.prefix_hit_tokens, "forks": [f.id for f in s.forks]} for s in engine.sequences],
            "running": [s.id for s in engine.running], "waiting": [s.id for s in engine.waiting],
            "finished": [s.id for s in engine.finished], "schedule() returned": side.scheduled,
            "stats": {name: getattr(stats, name) for name in ("steps", "generated_tokens", "batch_sizes", "scheduled_tokens",
                                                              "blocks_in_use", "tokens_stored", "preemptions", "prefix_hit_tokens", "copies")},
            "free blocks": engine.allocator.num_free_blocks, "ref counts (multiset)": sorted(c for c in engine.allocator.ref_counts if c)}


def result_reading(result):
    """What generate() promises: an EngineResult whose sequences, finish order and stats are the reference's (the
    clock's readings only as types and signs)."""
    stats = result.stats
    return {"type": type(result).__name__, "outputs": result.outputs, "finish_order": list(result.finish_order),
            "sequences": [(s.id, s.index, s.token_ids, s.admitted_step, s.finished_step, s.preemptions, s.prefix_hit_tokens,
                           type(s.ttft).__name__, s.latency >= s.ttft, s.tpot >= 0) for s in result.sequences],
            "stats": {name: getattr(stats, name) for name in ("steps", "generated_tokens", "batch_sizes", "scheduled_tokens", "blocks_in_use",
                                                              "tokens_stored", "preemptions", "prefix_hit_tokens", "copies", "computed_tokens",
                                                              "peak_blocks", "kv_utilization")} | {"throughput > 0": stats.throughput > 0}}


@functools.lru_cache(maxsize=4096)
def near_tie(model, prompt, max_new):
    """Whether a request's greedy tokens alone meet a near tie (the two best logits within tie_epsilon(model)): float
    rounding of a batched, paged forward in half precision may flip it."""
    n = min(max_new, model.config.n_positions - len(prompt))
    if not prompt or n < 1:
        return False  # refused: no tokens
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids], device=model.device), torch.arange(len(ids), device=model.device)[None])[0, -1].float()
            top = logits.topk(2).values
            if float(top[0] - top[1]) < tie_epsilon(model):
                return True
            ids.append(int(logits.argmax()))
    return False


def run_engine_scenario(student, model_device, seed, sharing, examples):
    def check(scenario):
        config, bs, max_batch, requests, num_blocks, budget, caching, eos, dtype = scenario
        model = small_model(config, model_device, dtype=dtype)
        # Greedy tokens are compared exactly: in half precision, where a request meets a near tie (most do: these models'
        # two best logits are ~0.2 apart), only an error of yours is reported (a dtype mixed up), not a difference.
        tied = dtype != torch.float32 and any(near_tie(model, tuple(r["prompt"]), r["max_new"]) for r in requests)
        try:
            compared(scenario, model)
        except Divergence as divergence:
            if tied and "yours raised" not in str(divergence):
                reject()
            raise

    def compared(scenario, model):
        config, bs, max_batch, requests, num_blocks, budget, caching, eos, dtype = scenario
        if eos == "first":  # the token request 0 gets first: EOS comes, and early
            prompt = requests[0]["prompt"]
            eos = int(model(torch.tensor([prompt], device=model.device), torch.arange(len(prompt), device=model.device)[None])[0, -1].argmax())
        options = dict(num_blocks=num_blocks, block_size=bs, max_num_batched_tokens=budget, enable_prefix_caching=caching)
        options |= {} if eos == "default" else {"eos_token_id": eos}
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        twins = Twins(Side(mod=reference, evicted=False, scheduled=None), Side(mod=student, evicted=False, scheduled=None),
                      engine_reading, hint=DIFF_HINTS["5d" if sharing else "5c"])

        def build(side):
            engine = side.engine = side.mod.Engine(model, max_batch, **options)
            engine.start = time.perf_counter()
            schedule = engine.schedule

            def recorded():  # what each step's schedule() decided, read by the observer
                scheduled = schedule()
                side.scheduled = [(seq.id, n) for seq, n in scheduled]
                return scheduled
            engine.schedule = recorded
            if side.mod is reference:
                watch_evictions(side)
        if twins.call(f"engine = Engine({dtype_name(dtype)} model with {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}; "
                      f"max_batch_size={max_batch}, {shown})", build) is None:
            return  # refused, as the reference refuses it

        def request(side, r):
            return side.mod.Request(list(r["prompt"]), r["max_new"], arrival_step=r["arrival"], n=r["n"], sampling=r["sampling"])

        def step(side):
            side.scheduled = None
            side.engine.step()
            side.engine.step_index += 1  # as run() does after every step, idle ones too

        try:
            for t in range(ENGINE_STEPS):
                for i, r in enumerate(requests):
                    if r["submit"] == t:
                        twins.call(f"engine.add_request(request {i}: prompt {r['prompt']}, max_new_tokens={r['max_new']}, "
                                   f"arrival_step={r['arrival']}, n={r['n']}, sampling={r['sampling']})",
                                   lambda s, r=r: [seq.id for seq in s.engine.add_request(request(s, r))])
                ref = twins.reference.engine
                if t > max(r["submit"] for r in requests) and not (ref.pending or ref.waiting or ref.running):
                    break
                twins.call(f"engine.step() at step_index {t}", attempt(step))
        except Evicted:
            return
        if not sharing:  # the same requests through generate(), which runs an engine to the end (waiting for arrivals)
            twins.call(f"generate(model, the requests above, {max_batch}, {shown})",
                       lambda s: result_reading(s.mod.generate(model, [request(s, r) for r in requests], max_batch, **options)))

    explore(engine_scenarios(sharing), check, seed=seed, examples=examples, edges=SHARING_EDGES if sharing else ENGINE_EDGES)


def edge(requests, bs, max_batch, num_blocks=None, budget=512, caching=False, n_positions=24):
    """A named edge of the engine's contract, as engine_scenarios draws one: a 1-layer float32 model, EOS never."""
    requests = [dict(prompt=list(prompt), max_new=max_new, arrival=arrival, submit=0, n=n, sampling=reference.GREEDY)
                for prompt, max_new, arrival, n in requests]
    return (gpt.GPTConfig(n_positions=n_positions, n_embd=8, n_layer=1, n_head=2), bs, max_batch, requests, num_blocks,
            budget, caching, "never", torch.float32)


# Tried first at every seed, whatever the seed draws (issue 41): the token budget equal to, one below (refused) and
# one above max_batch_size while a prompt is chunked beside a decode; a request that fills a context the block size
# does not divide, on a pool of exactly its blocks; a pool one block short of a request (refused); two sequences that
# outgrow a pool holding either alone (the newest is preempted, and resumes). (These random
# models mostly echo their last token: what a chunk feeds, test_5c_chunked_prefill_keeps_the_others_decoding sees.)
ENGINE_EDGES = [
    edge([(range(100, 101), 4, 0, 1), (range(200, 205), 2, 1, 1)], bs=2, max_batch=2, budget=2),
    edge([(range(100, 103), 2, 0, 1), (range(200, 203), 2, 0, 1)], bs=2, max_batch=3, budget=2),
    edge([(range(100, 104), 3, 0, 1), (range(200, 203), 3, 0, 1)], bs=4, max_batch=2, budget=3),
    edge([(range(100, 119), 3, 0, 1)], bs=4, max_batch=1, num_blocks=6, n_positions=22),
    edge([(range(100, 109), 4, 0, 1)], bs=4, max_batch=1, num_blocks=2),
    edge([(range(100, 103), 5, 0, 1), (range(200, 203), 5, 0, 1)], bs=2, max_batch=2, num_blocks=4),
]
# With sharing: A and B share their first 4 tokens (2 blocks of 2); B is admitted with them as hits, preempted when A
# needs a block, and resumes after A has finished, its first blocks found again in the prefix cache (free, still
# cached). Then n = max_batch_size + 1 continuations of one prompt (refused) and n = max_batch_size (forked).
SHARING_EDGES = [
    edge([([464, 3290, 318, 257, 1310], 6, 0, 1), ([464, 3290, 318, 257, 50256], 6, 0, 1)], bs=2, max_batch=2, num_blocks=5,
         budget=16, caching=True),
    edge([(range(100, 105), 3, 0, 3)], bs=2, max_batch=2, caching=True),
    edge([(range(100, 105), 3, 0, 2), (range(100, 107), 2, 1, 1)], bs=2, max_batch=2, budget=2, caching=True),
]


def test_5c_differential_engine(student, device, seed):
    """Engines stepped by hand on generated workloads (requests added at generated steps, idle steps, late adds,
    token budgets at max_batch_size and block edges, pools just big enough or one block short, EOS early), yours
    and the reference's observed after EVERY step: each sequence's tokens, computed tokens, table, admission,
    finish and preemptions; who runs and waits, in order; what schedule() returned; every stat; the pool. Then the
    same requests through generate()."""
    run_engine_scenario(student, device, seed, sharing=False, examples=25)


def test_5d_differential_engine_sharing(student, device, seed):
    """As test_5c_differential_engine, with prefix caching (prompts sharing blocks, whole prompts cached, hits on
    freed blocks, preempted sequences resuming from the cache), n > 1 continuations forked from one prompt
    (copy-on-write) and seeded sampling: observed after every step, up to an allocation where correct designs may
    take different free blocks (and so evict other cached blocks)."""
    run_engine_scenario(student, device, seed, sharing=True, examples=25)


# -- 5e: beam search on the blocks

@st.composite
def beam_scenarios(draw):
    """A prompt of 1, bs +- 1, 2 * bs +- 1 tokens, then up to eight steps of beam search of width 1 to 4: each new
    beam's parent drawn (several children, pruned beams, fewer beams when some finish, none when all do), on a
    roomy pool or on the smallest one the reference runs each step on."""
    bs = draw(st.sampled_from(BLOCK_SIZES))
    prompt = draw(st.lists(st.integers(0, 999), min_size=1, max_size=3 * bs + 1))
    width, live, story = draw(st.integers(1, 4)), 1, []
    for _ in range(draw(st.integers(1, 8))):
        parents = draw(st.lists(st.integers(0, live - 1), min_size=0 if story else 1, max_size=width))
        story.append(parents)
        live = len(parents)
        if not live:
            break
    return bs, prompt, story, draw(st.booleans())


def beam_reading(side):
    """The beams after a step: each one's tokens read back from the pool's slots through its table (the copies made
    in order, then its new token written), its table's tokens and block structure, the ref count of each of its
    blocks, the free blocks and the ref counts as a multiset."""
    label, a = Labels(), side.allocator
    return {"beams": [{"reads": [side.store.get(t.blocks[p // t.block_size] * t.block_size + p % t.block_size) for p in range(t.num_tokens)],
                       "num_tokens": t.num_tokens, "blocks": [label(b) for b in t.blocks], "ref counts": [a.ref_counts[b] for b in t.blocks]}
                      for t in side.tables],
            "free blocks": a.num_free_blocks, "ref counts (multiset)": sorted(c for c in a.ref_counts if c)}


def test_5e_differential_beam_step(student, seed):
    """Generated beam searches (block sizes 1 to 8, widths 1 to 4, pruned and finishing beams, the search ending),
    each step through beam_step on yours and the reference, observed after every step: what it returned (a
    table per new beam, the number of copies: exactly the k - 1 a partly filled parent with k children needs), each
    beam's tokens read back through the copies, the block structure and ref counts, the free blocks; on the
    smallest pool the reference runs the step on, no NoFreeBlocks."""
    def check(scenario):
        bs, prompt, story, tight = scenario
        twins = Twins(Side(mod=reference), Side(mod=student), beam_reading, hint=DIFF_HINTS["5e"])
        size = 64

        def build(side):
            side.allocator, side.store = side.mod.BlockAllocator(size, block_size=bs), {}
            table = side.mod.BlockTable(bs)
            table.append(len(prompt), side.allocator)
            side.store.update({slot: token for slot, token in zip(table.slot_mapping(0, len(prompt)), prompt)})
            side.tables = [table]
        twins.call(f"a prompt of {plural(len(prompt), 'token')} in a BlockTable({bs}) on BlockAllocator({size}, block_size={bs})", build)
        histories = [list(prompt)]
        for step, parents in enumerate(story):
            new_histories = [histories[p] + [1000 + 10 * step + j] for j, p in enumerate(parents)]
            room = max(beams_need(histories, bs), beams_need(new_histories, bs))

            def beam(side):
                taken = []
                if tight:  # leave only what the reference needs on the way: the larger of before and after
                    in_use = size - side.allocator.num_free_blocks
                    taken = [side.allocator.allocate() for _ in range(max(0, side.allocator.num_free_blocks - max(0, room - in_use)))]
                out = side.mod.beam_step(side.tables, list(parents), side.allocator)
                for block in taken:
                    side.allocator.free(block)
                tables, copies = out
                for src, dst in copies:  # the cache's copies, in order, then each new beam's token at its slot
                    for offset in range(bs):
                        side.store[dst * bs + offset] = side.store.get(src * bs + offset)
                for t, history in zip(tables, new_histories):
                    p = len(history) - 1
                    side.store[t.blocks[p // bs] * bs + p % bs] = history[-1]
                side.tables = list(tables)
                return {"returned": (type(out).__name__, len(out), type(tables).__name__, type(copies).__name__), "new tables": len(tables),
                        "copies": len(copies)}
            twins.call(f"tables, copies = beam_step(tables, parents={parents}, allocator)"
                       + (f" on a pool left with {room} blocks beside the beams'" if tight else ""), attempt(beam))
            histories = new_histories

    explore(beam_scenarios(), check, seed=seed, examples=80, edges=BEAM_EDGES)


# Tried first at every seed (issue 41): a prompt of exactly one block, three children of one parent, a pruned beam, four
# beams, then none (all finish), on the smallest pool; a partly filled last block with two children (one copy), the
# children swapped, one beam left; block size 1, a one-token prompt and width 1.
BEAM_EDGES = [
    (4, [0, 1, 2, 3], [[0, 0, 0], [0, 2], [1, 1, 0, 0], []], True),
    (3, [5, 6, 7, 8, 9], [[0, 0], [1, 0], [0]], True),
    (1, [0], [[0]], False),
]
