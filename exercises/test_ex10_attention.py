"""Checker for exercise 10, attention kernels: pytest exercises/test_ex10_attention.py (one part: -k 10a, 10b, 10c, 10d)

Everything is compared with torch's own softmax and scaled_dot_product_attention (SDPA) in fp32, on seeded
random inputs, near unit scale and far from it (scores shifted by up to +-1000); memory traffic is counted
(workshop.attention.HBM), the working set measured (LargestTensor: the largest tensor a part creates) and the
paged KV blocks read recorded (BlocksRead), never timed.
"""

import random
import weakref

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import gpt
import solutions.ex10_attention as reference
import solutions.ex5_paged_kv_cache as ex5
from workshop import attention as memory
from workshop.grading.differential import GreedyTokens, Tolerance, Twins, explore
from workshop.grading.harness import describe_token_mismatch, implementation
from workshop.grading.scenarios import around, prompts, small_config, small_model
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex10.md"
MASK_NAME = " with exercise 2's lower-right mask"
TOL = 2e-5  # fp32: the order of the additions differs from SDPA's, nothing else may
FAR_TOL = 1e-3  # scores near +-1000: fp32 numbers there are 6e-5 apart, so a correct design that keeps log-sum-exps
#                 (not a max and a sum) is exact to ~1e-4; the bugs these inputs catch give NaN, inf or 0
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "10a": ["softmax_stats"],
    "10b": ["flash_attention"],
    "10c": ["merge_partials", "flash_decoding", "paged_flash_decoding"],
    "10d": ["flash_paged_attention"],
}
DIFFERENTIAL_API = {  # each public name of the stub -> the check that runs it against the reference
    "softmax_stats": "test_10a_differential", "online_softmax": "test_10a_differential",
    "flash_attention": "test_10b_differential", "attention": "test_10b_differential",
    "merge_partials": "test_10c_differential_merge", "flash_decoding": "test_10c_differential_decoding",
    "paged_flash_decoding": "test_10c_differential_paged", "check_paged_call": "test_10c_differential_paged",
    "flash_paged_attention": "test_10d_differential", "use_flash_decoding": "test_10d_differential_engine",
}


@pytest.fixture(scope="module")
def student():
    return implementation("ex10_attention")


def where_differs(got, expected, dims):
    """The first (largest) difference of two tensors, named by their dims: 'batch 1, head 0, query 5: ...'."""
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    error = (got - expected).abs().nan_to_num(float("inf"))
    index = torch.unravel_index(error.argmax(), error.shape)
    place = ", ".join(f"{name} {int(i)}" for name, i in zip(dims, index))
    return (f"largest difference {error.max().item():.3g} at {place}: got {got[index].item():.6g}, expected "
            f"{expected[index].item():.6g}" + (" (NaN: an exp of -inf - -inf where a row of a tile sees no key at all, or 0/0?)"
                                                if got.isnan().any() else ""))


def close(got, expected, tol=TOL):
    return isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.allclose(got, expected, atol=tol, rtol=tol, equal_nan=True)


# ----------------------------------------------------------------------------------------------
# 10a: the online softmax

ROWS = ["random", "rising", "falling", "first half -inf", "all -inf", "1000 then -1000", "-1000 rising to 1000", "one -inf",
        "all below 0", "all near -1000", "all near +1000"]
ROW_TOL = [TOL] * 9 + [FAR_TOL] * 2


def softmax_rows(seed, n):
    """Rows that exercise every trap: random, rising (the max grows in every chunk), falling, leading -inf
    (a row masked at first), all -inf, huge values both ways (exp overflows unless shifted by the max), and
    rows wholly below or far from zero (a max that starts at 0, or an exp not shifted by the max, fails them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(ROWS), n, generator=g) * 3
    x[1] = torch.linspace(-5, 20, n)  # rising: the max changes in every chunk
    x[2] = torch.linspace(20, -5, n)  # falling
    x[3, : n // 2] = float("-inf")  # the first chunks see nothing but -inf
    x[4] = float("-inf")  # a row with nothing to attend to
    x[5, : n // 3], x[5, n // 3:] = 1000.0, -1000.0  # huge first, then hugely negative
    x[6] = torch.linspace(-1000, 1000, n)
    x[7, torch.randint(0, n, (1,), generator=g)] = float("-inf")
    x[8] = -x[8].abs() - 1  # every value below zero: the max is negative
    x[9] -= 1000  # exp(x) is 0 for every value: only exp(x - max) is not
    x[10] += 1000  # exp(x) overflows for every value
    return x


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64])
def test_10a_softmax_stats_equal_the_whole_row(student, seed, chunk_size):
    """m is each row's max and l = sum exp(x - m), from the chunks alone; rows of -inf, of +-1000 and wholly below
    zero included."""
    x = softmax_rows(seed, 50)
    m, l = student.softmax_stats(iter(x.split(chunk_size, dim=-1)))
    expected_m = x.amax(dim=-1)
    expected_l = torch.exp(x - expected_m[:, None]).nan_to_num(0.0).sum(dim=-1)
    rows = ROWS
    for name, got, expected in (("m", m, expected_m), ("l", l, expected_l)):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (
            f"softmax_stats returned {name} of shape {None if not isinstance(got, torch.Tensor) else tuple(got.shape)}, "
            f"expected [{x.shape[0]}]: one number per row (see {HINTS}, softmax_stats, hint 2).")
        bad = [i for i in range(x.shape[0]) if not close(got[i:i + 1], expected[i:i + 1], ROW_TOL[i])]
        assert not bad, (f"with chunks of {chunk_size}, {name} is wrong for the rows {[rows[i] for i in bad]}: row "
                         f"{rows[bad[0]]!r} got {name} = {got[bad[0]].item():.6g}, expected {expected[bad[0]].item():.6g}. "
                         + ("The max must be the max of EVERY chunk seen so far (carried from chunk to chunk), not the last "
                            "chunk's, and it starts at -inf, not 0 (a row may be wholly below zero). " if name == "m" else
                            "When the max grows, the sum so far was relative to the old max: rescale it by exp(old - new). "
                            "Every exp is of x minus the running max (never of x alone: exp(1000) overflows, exp(-1000) "
                            "is 0). A row still all -inf must stay at l = 0, not NaN. ")
                         + f"(see {HINTS}, softmax_stats, hints 1 and 2).")
    got, expected = student.online_softmax(x, chunk_size), torch.softmax(x, dim=-1)
    bad = [rows[i] for i in range(x.shape[0]) if not torch.allclose(got[i], expected[i], atol=ROW_TOL[i], equal_nan=True)]
    assert not bad, (f"online_softmax (given) from your statistics differs from torch.softmax for the rows {bad} "
                     f"(see {HINTS}, softmax_stats).")


def test_10a_one_chunk_at_a_time(student, seed):
    """softmax_stats keeps O(R) numbers between chunks: every tensor it creates is about one chunk, and a chunk it
    has folded in is let go (the chunks here are made one by one, as a long row read from memory would be)."""
    chunk, x = 8, softmax_rows(seed, 256)
    R, n = x.shape
    handed_out, most_alive, when = [], 0, 0

    def make(start):
        c = x[:, start:start + chunk].clone()
        handed_out.append(weakref.ref(c))
        return c

    def chunks():
        nonlocal most_alive, when
        for start in range(0, n, chunk):
            alive = sum(ref() is not None for ref in handed_out)  # the previous chunk may still be in the loop's variable
            if alive > most_alive:
                most_alive, when = alive, start // chunk
            yield make(start)

    with memory.LargestTensor(x) as largest:
        m, l = student.softmax_stats(chunks())
    expected_m = x.amax(dim=-1)
    expected_l = torch.exp(x - expected_m[:, None]).nan_to_num(0.0).sum(dim=-1)
    assert close(m, expected_m) and close(l, expected_l, FAR_TOL), (
        f"softmax_stats is wrong for rows of {n} in chunks of {chunk}: see test_10a_softmax_stats_equal_the_whole_row.")
    limit = 2 * R * chunk
    assert largest.numel <= limit, (
        f"for {R} rows of {n} columns in chunks of {chunk}, your softmax_stats created a tensor of shape {largest.shape} "
        f"({largest.numel:,} numbers, in {largest.op}); one chunk is {R * chunk:,} numbers, the whole rows {R * n:,}. Fold each "
        f"chunk into a running max and sum of shape [R] as it comes: no concatenation of the chunks, no list of per-chunk "
        f"results (see {HINTS}, softmax_stats, hint 2).")
    assert most_alive <= 2, (
        f"when chunk {when + 1} of {n // chunk} was asked for, your softmax_stats still held {most_alive} earlier "
        f"chunks: a chunk is seen once and can be let go once it is folded in (no list(chunks), no list of chunks kept "
        f"for later). Between chunks, keep only the running max and sum, [R] each (see {HINTS}, softmax_stats, hint 2).")


# ----------------------------------------------------------------------------------------------
# 10b: FlashAttention

B, H, D = 2, 3, 8


def qkv(g, q_len, kv_len, scale=1.0):
    return (torch.randn(B, H, q_len, D, generator=g) * scale, torch.randn(B, H, kv_len, D, generator=g),
            torch.randn(B, H, kv_len, D, generator=g))


def sdpa(q, k, v, causal):
    mask = memory.lower_right_mask(q.shape[2], k.shape[2]) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


FLASH_CASES = [  # (Tq, Tk, block_q, block_k, causal, query scale)
    (64, 64, 16, 16, True, 1.0),  # the prefill, tiles dividing T
    (50, 50, 16, 8, True, 1.0),  # T not a multiple of either tile
    (37, 37, 64, 64, True, 1.0),  # one tile bigger than the sequence
    (7, 40, 4, 16, True, 1.0),  # a chunk of 7 queries after 33 cached keys: the lower-right mask
    (12, 45, 5, 7, True, 1.0),  # the same, tiles that straddle the diagonal at odd offsets
    (1, 33, 1, 8, True, 1.0),  # one decoding query
    (30, 45, 8, 5, False, 1.0),  # no mask
    (40, 40, 8, 8, True, 30.0),  # huge scores: the running max keeps exp from overflowing
]


def check_flash(student, q, k, v, block_q, block_k, causal):
    hbm = memory.HBM(q, k, v, causal)
    student.flash_attention(hbm, block_q, block_k)
    expected = sdpa(q, k, v, causal)
    Tq, Tk = q.shape[2], k.shape[2]
    assert close(hbm.output, expected), (
        f"flash_attention with Tq={Tq}, Tk={Tk}, block_q={block_q}, block_k={block_k}, causal={causal} differs from SDPA"
        f"{MASK_NAME if causal else ''}: {where_differs(hbm.output, expected, ('batch', 'head', 'query', 'dim'))}. "
        f"Likely causes: the running sum or output not rescaled by exp(old max - new max) when the max grows; the max "
        f"not carried from tile to tile; inside a tile on the diagonal, the mask built from tile-local indices instead "
        f"of positions (query i is at Tk - Tq + i); a last, shorter tile cut wrong (see {HINTS}, flash_attention, hints 1-3).")
    return hbm


@pytest.mark.parametrize("case", range(len(FLASH_CASES)))
def test_10b_flash_attention_equals_sdpa(student, seed, case):
    Tq, Tk, block_q, block_k, causal, scale = FLASH_CASES[case]
    check_flash(student, *qkv(torch.Generator().manual_seed(seed + case), Tq, Tk, scale), block_q, block_k, causal)


def test_10b_random_shapes_and_tiles(student, seed):
    """Seeded: any lengths, any tile sizes, with or without the mask."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(6):
        Tk = rng.randint(1, 70)
        Tq = rng.randint(1, Tk)
        check_flash(student, *qkv(g, Tq, Tk), rng.randint(1, 20), rng.randint(1, 20), rng.random() < 0.8)


def far_qkv(g, q_len, kv_len, batch=B, heads=H, shifts=(-1000, 1000)):
    """q, k, v whose scores are far from zero, and exact in fp32 in any order of additions: head dim 16 (scale
    1/4), entries on a grid of 1/8, and key dim 0 fixed to 1 so that query dim 0 shifts all of a query's
    scores by an amount drawn from `shifts` (softmax does not change; exp of an unshifted score overflows or
    underflows)."""
    d = 16
    q = torch.randint(-32, 33, (batch, heads, q_len, d), generator=g) / 8
    k = torch.randint(-8, 9, (batch, heads, kv_len, d), generator=g) / 8
    q[..., 0] = 4 * torch.randint(shifts[0], shifts[1] + 1, (batch, heads, q_len), generator=g)  # each query its own shift
    k[..., 0] = 1.0
    return q, k, torch.randn(batch, heads, kv_len, d, generator=g)


def test_10b_scores_far_from_zero(student, seed):
    """Seeded: scores shifted by up to +-1000, each query by its own amount (rows wholly below zero, rows that
    overflow exp, side by side in a tile): equal to SDPA."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for causal in (True, False, True):
        Tk = rng.randint(2, 50)
        Tq = rng.randint(1, Tk)
        q, k, v = far_qkv(g, Tq, Tk)
        block_q, block_k = rng.randint(1, 12), rng.randint(1, 12)
        hbm = memory.HBM(q, k, v, causal)
        student.flash_attention(hbm, block_q, block_k)
        expected = sdpa(q, k, v, causal)
        assert close(hbm.output, expected, FAR_TOL), (
            f"flash_attention with Tq={Tq}, Tk={Tk}, block_q={block_q}, block_k={block_k}, causal={causal}, scores "
            f"shifted by up to +-1000 (each query's by its own amount: softmax is the same) differs from SDPA: "
            f"{where_differs(hbm.output, expected, ('batch', 'head', 'query', 'dim'))}. Each exp must be of a score minus "
            f"its OWN row's running max (one per query, batch row and head, not one per tile), and that max starts at "
            f"-inf, not 0: exp(-1000 - 0) is 0 and the sum of a row wholly below zero would be 0 "
            f"(see {HINTS}, flash_attention, hint 2).")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no_mask"])
def test_10b_bytes_moved(student, seed, causal):
    """The bytes loaded and stored through hbm, against the FlashAttention formula (Q and O once, K and V once
    per query tile, causal tiles skipped) and against the standard path that writes the T x T scores."""
    T, block_q, block_k = 128, 16, 16
    q, k, v = qkv(torch.Generator().manual_seed(seed), T, T)
    hbm = check_flash(student, q, k, v, block_q, block_k, causal)
    formula = memory.flash_attention_bytes(B, H, T, T, D, block_q, block_k, causal)
    standard = memory.standard_attention_bytes(B, H, T, T, D)
    element = q.element_size()
    least_read, least_written = element * B * H * D * 3 * T, element * B * H * D * T
    moved = (f"you read {hbm.bytes_read:,} and wrote {hbm.bytes_written:,} bytes ({hbm.loads} loads, {hbm.stores} stores); "
             f"FlashAttention moves at most {formula:,}, the standard path that writes the scores {standard:,}")
    assert hbm.bytes_read >= least_read and hbm.bytes_written >= least_written, (
        f"{moved}, yet every query, key and value must be read once ({least_read:,} bytes) and every output row written "
        f"({least_written:,}): reach q, k, v only through hbm.load and write o only through hbm.store (see {HINTS}, "
        f"flash_attention, hint 2).")
    assert hbm.bytes_moved <= formula, (
        f"{moved}. The extra traffic: a Q tile loaded again for each K tile, an O tile stored more than once, K/V tiles "
        f"that no query of the tile can see loaded (and masked) instead of skipped, or tiles larger than asked "
        f"(see {HINTS}, flash_attention, hint 2).")


def test_10b_fast_memory_stays_small(student, seed):
    """What the kernel holds between loads and stores (its 'SRAM'): no tensor larger than a few tiles."""
    T, block_q, block_k = 96, 8, 8
    q, k, v = qkv(torch.Generator().manual_seed(seed), T, T)
    hbm = memory.HBM(q, k, v, True)
    with memory.LargestTensor(*hbm.tensors.values()) as largest:
        student.flash_attention(hbm, block_q, block_k)
    limit = 2 * B * H * max(block_q, block_k) * max(block_k, D)
    assert close(hbm.output, sdpa(q, k, v, True)), f"flash_attention is wrong here (T={T}, tiles {block_q}): see the other 10b checks."
    assert largest.numel <= limit, (
        f"with tiles of {block_q} x {block_k} (B={B}, H={H}, d={D}), your flash_attention created a tensor of shape "
        f"{largest.shape} ({largest.numel:,} numbers, in {largest.op}); a few tiles are at most {limit:,}. On a GPU that "
        f"would not fit in SRAM: keep one query tile's running max, sum and output, and one K/V tile, and compute "
        f"masks from positions inside the tile (see {HINTS}, flash_attention, hint 1).")


# ----------------------------------------------------------------------------------------------
# 10c: Flash-Decoding

def partial(q, k, v):
    """The checker's own partial attention of one chunk: normalised output and log-sum-exp."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def test_10c_merge_partials(student, seed):
    """Partial results of chunks of different sizes, in shuffled order, with large log-sum-exps (every one far below
    zero, or far above), merge into attention over all the keys."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    cases = (("scores ~1", TOL, lambda T: qkv(g, 1, T)),
             ("scores x300", 1e-3, lambda T: qkv(g, 1, T, 300.0)),  # log-sum-exps near 1000, known to ~1e-4 in fp32
             ("scores -1000 to -500", FAR_TOL, lambda T: far_qkv(g, 1, T, shifts=(-1000, -500))),  # exp(lse) is 0 for all
             ("scores 500 to 1000", FAR_TOL, lambda T: far_qkv(g, 1, T, shifts=(500, 1000))))
    for name, tol, inputs in cases:
        T = rng.randint(20, 60)
        q, k, v = inputs(T)
        cuts = sorted(rng.sample(range(1, T), rng.randint(0, 5)))
        bounds = list(zip([0, *cuts], [*cuts, T]))
        rng.shuffle(bounds)
        parts = [partial(q, k[:, :, a:b], v[:, :, a:b]) for a, b in bounds]
        out, lse = student.merge_partials(torch.stack([o for o, _ in parts]), torch.stack([s for _, s in parts]))
        expected_out, expected_lse = partial(q, k, v)
        sizes = [b - a for a, b in bounds]
        assert close(out, expected_out, tol), (
            f"merging {len(bounds)} chunks of {sizes} keys ({name}): {where_differs(out, expected_out, ('batch', 'head', 'query', 'dim'))}. "
            f"A chunk's weight is its share of the whole softmax's mass, exp(its lse - the total lse), not its share of "
            f"the keys; and exp of large lses overflows (of lses far below zero, underflows to 0) unless shifted by their "
            f"max, which starts at -inf, not 0 (see {HINTS}, merge_partials, hints 1 and 2).")
        assert close(lse, expected_lse, tol), (
            f"merging {len(bounds)} chunks ({name}): the merged log-sum-exp is wrong, "
            f"{where_differs(lse, expected_lse, ('batch', 'head', 'query'))} (see {HINTS}, merge_partials, hint 2).")


@pytest.mark.parametrize("T,chunk_size", [(64, 16), (45, 8), (45, 1), (10, 64), (200, 37)])
def test_10c_flash_decoding_equals_sdpa(student, seed, T, chunk_size):
    q, k, v = qkv(torch.Generator().manual_seed(seed + T), 1, T)
    got, expected = student.flash_decoding(q, k, v, chunk_size), sdpa(q, k, v, False)
    assert close(got, expected), (
        f"flash_decoding over {T} keys in chunks of {chunk_size} (the last one {T % chunk_size or chunk_size}) differs "
        f"from SDPA: {where_differs(got, expected, ('batch', 'head', 'query', 'dim'))}. Check each chunk's lse and the "
        f"merge's weights, and that the last, shorter chunk is neither dropped nor padded (see {HINTS}, flash_decoding).")


def test_10c_scores_far_from_zero(student, seed):
    """Seeded: flash_decoding and paged_flash_decoding with scores shifted by up to +-1000 (each head by its own
    amount): a chunk's log-sum-exp taken without its max is inf or -inf there."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    T, chunk_size = rng.randint(2, 80), rng.randint(1, 20)
    q, k, v = far_qkv(g, 1, T)
    got, expected = student.flash_decoding(q, k, v, chunk_size), sdpa(q, k, v, False)
    assert close(got, expected, FAR_TOL), (
        f"flash_decoding over {T} keys in chunks of {chunk_size}, scores shifted by up to +-1000 (each head by its own "
        f"amount: softmax is the same), differs from SDPA: {where_differs(got, expected, ('batch', 'head', 'query', 'dim'))}. "
        f"Take each chunk's log-sum-exp as torch.logsumexp does, max + log(sum(exp(s - max))): exp of a raw score "
        f"overflows past ~88 and is 0 below ~-88 (see {HINTS}, flash_decoding, hint 2).")
    block_size, length, blocks_per_chunk = rng.choice([1, 4, 8]), rng.randint(1, 60), rng.randint(1, 4)
    q, pool_k, pool_v, table, expected = paged_case(g, block_size, 20 * 8 // block_size, length, 1, far=True)
    got = student.paged_flash_decoding(q, pool_k, pool_v, table, length, blocks_per_chunk)
    assert close(got, expected, FAR_TOL), (
        f"paged_flash_decoding, {length} tokens in blocks of {block_size}, chunks of {blocks_per_chunk} blocks, scores "
        f"shifted by up to +-1000 (each head by its own amount): {where_differs(got, expected, ('head', 'dim'))}. Take "
        f"each chunk's log-sum-exp relative to its max (torch.logsumexp does), and merge with the max of the lses "
        f"(see {HINTS}, flash_decoding, hint 2).")


def paged_case(g, block_size, num_blocks, length, spare_blocks=0, far=False):
    """A pool of garbage (large values: a slot that counts but should not changes the result), a shuffled block
    table, and the sequence's keys and values written at its slots; NaN in the slots past the length and in the
    table's spare blocks (stale memory may hold anything). far: scores far from zero (far_qkv)."""
    d = 16 if far else D
    pool_k = torch.randn(num_blocks, block_size, H, d, generator=g) * 50
    pool_v = torch.randn(num_blocks, block_size, H, d, generator=g) * 50 + 100
    needed = -(-length // block_size)
    table = torch.randperm(num_blocks, generator=g)[:needed + spare_blocks].tolist()
    if far:
        q, k, v = (t[0].transpose(0, 1) for t in far_qkv(g, 1, length, batch=1))  # [1, H, d] -> q [H, d]; k, v [length, H, d]
        q = q[0]
    else:
        k, v = torch.randn(length, H, d, generator=g), torch.randn(length, H, d, generator=g)
    for p in range(length):
        pool_k[table[p // block_size], p % block_size] = k[p]
        pool_v[table[p // block_size], p % block_size] = v[p]
    for pool in (pool_k, pool_v):
        pool[table[needed - 1], length - (needed - 1) * block_size:] = float("nan")
        pool[table[needed:]] = float("nan")
    if not far:
        q = torch.randn(H, d, generator=g)
    expected = F.scaled_dot_product_attention(q[:, None], k.transpose(0, 1), v.transpose(0, 1))[:, 0]
    return q, pool_k, pool_v, table, expected


PAGED_CASES = [  # (block_size, length, blocks_per_chunk, spare table entries)
    (4, 22, 2, 0),  # the last block half full
    (4, 24, 2, 0),  # full blocks only
    (4, 1, 3, 0),  # one token
    (4, 29, 3, 2),  # a table longer than the sequence
    (8, 57, 1, 0),  # a chunk per block
    (16, 100, 4, 1),
    (4, 24, 2, 1),  # full blocks, full chunks, and a spare entry after them
    (4, 20, 2, 2),  # full blocks, the last chunk one block short, spare entries
]


@pytest.mark.parametrize("case", range(len(PAGED_CASES)))
def test_10c_paged_flash_decoding_equals_sdpa(student, seed, case):
    block_size, length, blocks_per_chunk, spare = PAGED_CASES[case]
    g = torch.Generator().manual_seed(seed + case)
    q, pool_k, pool_v, table, expected = paged_case(g, block_size, 20, length, spare)
    for given in (table, torch.tensor(table)):
        got = student.paged_flash_decoding(q, pool_k, pool_v, given, length, blocks_per_chunk)
        assert close(got, expected), (
            f"paged_flash_decoding, {length} tokens in blocks of {block_size} (the last block holds "
            f"{length - (length - 1) // block_size * block_size}), chunks of {blocks_per_chunk} blocks, table "
            f"{table} as a {type(given).__name__}: {where_differs(got, expected, ('head', 'dim'))}. The pool's other "
            f"slots hold large garbage, and the slots of the last block at or past the length and the table's spare "
            f"blocks hold NaN (stale memory may hold anything): if they count, or blocks are taken in the wrong order, "
            f"the result changes. Cut those slots off before the product with the values: masking only their scores "
            f"leaves weight 0 times NaN, which is NaN (see {HINTS}, paged_flash_decoding, hints 1 and 2).")


def test_10c_paged_reads_only_its_blocks(student, seed):
    """Seeded: lengths that are mostly exact multiples of the block size, tables with spare entries after the
    blocks the length needs. The blocks read from each pool (workshop.attention.BlocksRead): exactly the first
    ceil(length / block_size) of the table, each element once."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(4):
        block_size, needed = rng.choice([1, 2, 4, 8]), rng.randint(1, 8)
        exact = case % 2 == 0 or block_size == 1 or rng.random() < 0.5
        length = needed * block_size - (0 if exact else rng.randint(1, block_size - 1))
        blocks_per_chunk, spare = rng.randint(1, 4), rng.randint(1, 3)
        q, pool_k, pool_v, table, expected = paged_case(g, block_size, 24, length, spare)
        with memory.BlocksRead(pool_k, pool_v) as reads:
            got = student.paged_flash_decoding(q, pool_k, pool_v, table, length, blocks_per_chunk)
        where = (f"{length} tokens in blocks of {block_size}, chunks of {blocks_per_chunk} blocks, table {table} (its "
                 f"first {needed} entries hold the sequence)")
        assert close(got, expected), f"paged_flash_decoding is wrong for {where}: see test_10c_paged_flash_decoding_equals_sdpa."
        for i, pool in enumerate(("key_pool", "value_pool")):
            read, own = reads.blocks(i), sorted(table[:needed])
            assert read == own, (
                f"for {where}, your paged_flash_decoding read the blocks {read} of {pool}, expected {own}: "
                + (f"{sorted(set(read) - set(own))} are not the sequence's (the table's spare entries, or blocks no "
                   f"entry names). When the length is an exact multiple of the block size, the last block is full and "
                   f"the next entry is not the sequence's: ceil(length / block_size) blocks, not length // block_size + 1"
                   if set(read) - set(own) else "some of the sequence's blocks were never read")
                + f" (see {HINTS}, paged_flash_decoding, hint 2).")
            assert reads.most_reads(i) <= 1, (
                f"for {where}, your paged_flash_decoding read some elements of {pool} {reads.most_reads(i)} times: each "
                f"chunk is its own run of blocks_per_chunk table entries, and together the runs cover the sequence's "
                f"blocks once (a run of blocks_per_chunk + 1 entries overlaps the next) (see {HINTS}, paged_flash_decoding, hint 2).")


def test_10c_paged_one_chunk_at_a_time(student, seed):
    """The largest tensor paged_flash_decoding creates is about one chunk, never the whole sequence."""
    block_size, length, blocks_per_chunk = 4, 96, 2
    q, pool_k, pool_v, table, expected = paged_case(torch.Generator().manual_seed(seed), block_size, 40, length)
    with memory.LargestTensor(pool_k, pool_v) as largest:
        got = student.paged_flash_decoding(q, pool_k, pool_v, table, length, blocks_per_chunk)
    assert close(got, expected), "paged_flash_decoding is wrong here: see test_10c_paged_flash_decoding_equals_sdpa."
    chunk, whole = blocks_per_chunk * block_size * H * D, length * H * D
    n_chunks = -(-length // (blocks_per_chunk * block_size))
    limit = 2 * max(chunk, n_chunks * H * D)
    assert largest.numel <= limit, (
        f"for {length} tokens in chunks of {blocks_per_chunk} blocks of {block_size}, your paged_flash_decoding created "
        f"a tensor of shape {largest.shape} ({largest.numel:,} numbers, in {largest.op}); one chunk's keys are {chunk:,} "
        f"numbers, the whole sequence's {whole:,}. Gather one run of blocks at a time and attend to it: the point of "
        f"split-KV is that each chunk's work fits in a thread block's fast memory (see {HINTS}, paged_flash_decoding, hint 1).")


# ----------------------------------------------------------------------------------------------
# 10d: exercise 5's engine on Flash-Decoding

def test_10d_same_as_the_gather_path(student, model, seed):
    """A packed batch (prompt chunks after cached tokens, single decode tokens, blocks shared by none) through
    flash_paged_attention and through exercise 5's paged_attention."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    config, block_size, num_blocks = model.config, 4, 48
    cache = ex5.PagedKVCache(config, num_blocks, block_size, "cpu")
    for pool in cache.keys + cache.values:
        pool.copy_(torch.randn(pool.shape, generator=g))
    free = list(range(num_blocks))
    rng.shuffle(free)
    token_ids, starts, tables = [], [], []
    for new in (1, rng.randint(2, 9), 1, rng.randint(10, 20)):
        start = rng.randint(0, 30)
        blocks = [free.pop() for _ in range(-(-(start + new) // block_size))]
        token_ids.append([0] * new), starts.append(start), tables.append(blocks)
    _, _, batch = ex5.pack(token_ids, starts, tables, block_size, "cpu")
    N, n_head = sum(len(t) for t in token_ids), config.n_head
    q = torch.randn(N, n_head, config.n_embd // n_head, generator=g)
    for layer in (0, config.n_layer - 1):
        got, expected = student.flash_paged_attention(q, cache, layer, batch), ex5.paged_attention(q, cache, layer, batch)
        assert close(got, expected), (
            f"flash_paged_attention differs from exercise 5's paged_attention on a packed batch of {len(token_ids)} sequences "
            f"(new tokens {[len(t) for t in token_ids]} after {starts} cached), layer {layer}: "
            f"{where_differs(got, expected, ('packed token', 'head', 'dim'))}. Each query sees its sequence's keys up to "
            f"its OWN position (a prompt chunk's queries see one more each), through that sequence's row of "
            f"batch.block_tables, in layer `layer`'s pools (see {HINTS}, flash_paged_attention, hints 1 and 2).")


def test_10d_long_sequences_one_chunk_at_a_time(student, model, seed):
    """Sequences of 160 to 200 tokens (lengths that are exact multiples of the block size among them), tables with
    spare entries, scores far from zero: flash_paged_attention equals the gather path, creates no tensor larger
    than about one chunk (or its output), and reads from the layer's pools only the blocks its queries' lengths
    need (workshop.attention.BlocksRead)."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    config, block_size, num_blocks, layer = model.config, 4, 200, rng.randrange(model.config.n_layer)
    n_head, head_dim = config.n_head, config.n_embd // config.n_head
    cache = ex5.PagedKVCache(config, num_blocks, block_size, "cpu")
    pools = (cache.keys[layer], cache.values[layer])
    for pool in pools:
        pool.copy_(torch.randn(pool.shape, generator=g))
    cache.keys[layer][..., 0] = 1.0  # with q's dim 0 below: each query's scores shifted by up to +-1000
    free = list(range(1, num_blocks))  # block 0 pads exercise 5's short tables: no sequence's here
    rng.shuffle(free)
    # (new tokens, length after them): a decode step at an exact multiple of the block size with an odd number of
    # blocks (a last run of two blocks would take in the spare entry), one mid-block, a prompt chunk that ends at an
    # exact multiple
    plan = [(1, block_size * (2 * rng.randint(20, 24) + 1)), (1, rng.randint(160, 200)),
            (rng.randint(2, 6), block_size * rng.randint(40, 50))]
    token_ids, starts, tables, own = [], [], [], set()
    for new, length in plan:
        needed = -(-length // block_size)
        blocks = [free.pop() for _ in range(needed + rng.randint(1, 2))]  # spare entries after the sequence's own
        token_ids.append([0] * new), starts.append(length - new), tables.append(blocks), own.update(blocks[:needed])
    _, _, batch = ex5.pack(token_ids, starts, tables, block_size, "cpu")
    q = torch.randn(len(batch.slots), n_head, head_dim, generator=g)
    q[..., 0] = torch.randint(-1000, 1001, q.shape[:2], generator=g) * head_dim ** 0.5
    expected = ex5.paged_attention(q, cache, layer, batch)
    with memory.LargestTensor(q, *cache.keys, *cache.values, *vars(batch).values()) as largest, memory.BlocksRead(*pools) as reads:
        got = student.flash_paged_attention(q, cache, layer, batch)
    where = (f"sequences of {[length for _, length in plan]} tokens in blocks of {block_size} ({[new for new, _ in plan]} "
             f"new), tables with spare entries, layer {layer}")
    assert close(got, expected, FAR_TOL), (
        f"flash_paged_attention differs from exercise 5's paged_attention for {where}, scores shifted by up to +-1000: "
        f"{where_differs(got, expected, ('packed token', 'head', 'dim'))}. See test_10d_same_as_the_gather_path first; "
        f"every exp is of a score minus its row's max (see {HINTS}, flash_paged_attention, hint 2).")
    chunks = -(-max(length for _, length in plan) // (2 * block_size))  # blocks_per_chunk=2: the partials to merge
    limit = 2 * n_head * head_dim * max(len(batch.slots), chunks, 2 * block_size)
    assert largest.numel <= limit, (
        f"for {where}, your flash_paged_attention created a tensor of shape {largest.shape} ({largest.numel:,} numbers, "
        f"in {largest.op}); a chunk of two blocks is {2 * block_size * n_head * head_dim:,} numbers, a whole sequence's "
        f"keys up to {max(length for _, length in plan) * n_head * head_dim:,}. Hand each query's sequence to "
        f"paged_flash_decoding through its block table: never gather a sequence's keys whole (see {HINTS}, "
        f"flash_paged_attention, hint 2).")
    for i, pool in enumerate(("keys", "values")):
        extra = sorted(set(reads.blocks(i)) - own)
        assert not extra, (
            f"for {where}, your flash_paged_attention read the blocks {extra} of the layer's {pool}, which are no "
            f"sequence's: a table's spare entries (or exercise 5's padding, block 0). A query at position p reads "
            f"ceil((p + 1) / block_size) blocks of its table, no more, even when p + 1 is an exact multiple of the "
            f"block size (see {HINTS}, flash_paged_attention, hint 2).")


def test_10d_engine_outputs_identical(student, model, tokenizer, seed):
    """Exercise 5's engine (the reference) with chunked prefill, staggered arrivals and a small pool, once with
    its gather and once under use_flash_decoding: the same tokens for every request."""
    rng = random.Random(seed)
    prompts = sample_prompts(model, 4, 3, 30, seed)
    plan = [(p, rng.randint(4, 12), rng.randint(0, 3)) for p in prompts]

    def run(flash):
        requests = [ex5.Request(list(p), n, arrival_step=a) for p, n, a in plan]
        options = dict(eos_token_id=-1, block_size=4, max_num_batched_tokens=12, num_blocks=24)
        if not flash:
            return ex5.generate(model, requests, 3, **options)
        with student.use_flash_decoding(ex5):
            return ex5.generate(model, requests, 3, **options)

    expected, got = run(False), run(True)
    assert ex5.paged_attention is not None and "flash" not in getattr(ex5.paged_attention, "__qualname__", ""), (
        "use_flash_decoding left exercise 5's paged_attention replaced after the `with`.")
    for i, ((prompt, _, _), out, ref) in enumerate(zip(plan, got.outputs, expected.outputs)):
        problem = describe_token_mismatch(out, ref, tokenizer, prompt)
        assert problem is None, (
            f"request {i} under use_flash_decoding: {problem}\nThe engine's gather path gave the expected tokens; check "
            f"flash_paged_attention first (test_10d_same_as_the_gather_path), then that every prompt chunk's queries "
            f"see the keys before the chunk (see {HINTS}, flash_paged_attention, hint 2).")


# ----------------------------------------------------------------------------------------------
# Differential checks: generated scenarios biased to the edges, the same calls on the reference and on yours,
# compared after every call on what the contract promises (workshop/grading/differential.py)

TIGHT = Tolerance(TOL, TOL)  # fp32: only the order of the additions may differ
FAR = Tolerance(FAR_TOL, FAR_TOL)  # scores or log-sum-exps near +-1000 (see FAR_TOL)
GATHER_PATH = ex5.paged_attention  # restored after every engine run, whatever the code under test left behind


def grid(g, shape, low, high):
    """Numbers on a grid of 1/8, from low/8 to high/8: exact in fp32 however they are summed, near +-1000 too."""
    return torch.randint(low, high + 1, shape, generator=g) / 8


ROW_KINDS = ("random", "rising", "-inf first", "all -inf", "one -inf", "below zero", "near -1000", "near +1000",
             "+1000 then -1000", "ties")


def stats_row(kind, n, g):
    """One row of n values of the given kind (the traps of softmax_stats' TODO)."""
    x = grid(g, (n,), -24, 24)
    if kind == "rising":
        x = torch.arange(n) * 2.0 - n  # the max changes at every column
    elif kind == "-inf first":
        x[: (n + 1) // 2] = float("-inf")
    elif kind == "all -inf":
        x[:] = float("-inf")
    elif kind == "one -inf":
        x[int(torch.randint(n, (1,), generator=g))] = float("-inf")
    elif kind == "below zero":
        x = -x.abs() - 1
    elif kind == "near -1000":
        x -= 1000
    elif kind == "near +1000":
        x += 1000
    elif kind == "+1000 then -1000":
        x[: (n + 1) // 2] += 1000
        x[(n + 1) // 2:] -= 1000
    elif kind == "ties":
        x = grid(g, (n,), 0, 1) * 8  # 0s and 1s: the max is met several times
    return x


@st.composite
def stats_scenarios(draw):
    """Rows of the kinds above (1 to 4 of them), n columns around a chunk size, cut evenly or at random places (chunks
    of one column included), fp32 or fp64."""
    kinds = draw(st.lists(st.sampled_from(ROW_KINDS), min_size=1, max_size=4))
    chunk = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n = draw(around(chunk, low=1, high=20))
    cuts = list(range(chunk, n, chunk))
    if n > 1 and draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1)))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))
    return kinds, n, chunk, list(zip([0, *cuts], [*cuts, n])), dtype, draw(st.integers(0, 2 ** 16))


def observe_stats(softmax_stats, x, bounds):
    """softmax_stats fed x's columns as views, chunk by chunk from a generator: its (m, l), whether every tensor it
    creates stays within two chunks, and whether at most two chunks were alive when the next one was asked for."""
    alive, most = [], 0

    def chunks():
        nonlocal most
        for a, b in bounds:
            most = max(most, sum(ref() is not None for ref in alive))
            chunk = x[:, a:b]
            alive.append(weakref.ref(chunk))
            yield chunk

    with memory.LargestTensor(x) as largest:
        result = softmax_stats(chunks())
    widest = max(b - a for a, b in bounds)
    return {"(m, l)": result, "every tensor created within two chunks": largest.numel <= 2 * x.shape[0] * widest,
            "at most two chunks alive when the next is asked for": most <= 2}


def test_10a_differential(student, seed):
    """Generated rows (-inf rows, +-1000, wholly below zero, ties; fp32 and fp64) cut into chunks of any widths, one
    column included: softmax_stats' (m, l) with their dtype, its working set and the chunks it holds, and
    online_softmax, against the reference's; rows near +-1000 to FAR_TOL, the rest to TOL."""
    def check(scenario):
        kinds, n, chunk, bounds, dtype, g_seed = scenario
        x = torch.stack([stats_row(kind, n, torch.Generator().manual_seed(g_seed + r)) for r, kind in enumerate(kinds)]).to(dtype)
        tol = FAR if any("1000" in kind for kind in kinds) else TIGHT
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, softmax_stats, hints 1 and 2.", tol=tol)
        rows = f"x = {str(dtype).removeprefix('torch.')} rows {kinds} of {n} columns, {x.tolist()}"
        twins.call(f"softmax_stats(an iterator over {rows} in chunks of the columns {[f'{a}:{b}' for a, b in bounds]})",
                   lambda side, x: observe_stats(side.softmax_stats, x, bounds), inputs=(x,), again=True)
        twins.call(f"online_softmax(x, chunk_size={chunk})", lambda side, x: side.online_softmax(x, chunk), inputs=(x,), again=True)

    explore(stats_scenarios(), check, seed=seed, examples=60, edges=STATS_EDGES)


# Tried first at every seed (issue 41): one column in one chunk; 8 columns in exactly two chunks of 4, a row all -inf
# beside one of +1000 then -1000; 9 columns, chunks of 8 and one past, in float64, -inf first and ties.
STATS_EDGES = [
    (["ties"], 1, 1, [(0, 1)], torch.float32, 0),
    (["all -inf", "+1000 then -1000"], 8, 4, [(0, 4), (4, 8)], torch.float32, 1),
    (["-inf first", "ties", "near -1000"], 9, 8, [(0, 8), (8, 9)], torch.float64, 2),
]


def flash_inputs(B, H, d, Tq, Tk, far, g_seed):
    """q [B, H, Tq, d], k, v [B, H, Tk, d]; far: each query's scores shifted by its own amount in -1000..1000 (q's dim 0
    times k's dim 0 = 1; entries on a grid of 1/8 and d 4 or 16, so the scores are exact in any order)."""
    g = torch.Generator().manual_seed(g_seed)
    if not far:
        return tuple(torch.randn(B, H, T, d, generator=g) for T in (Tq, Tk, Tk))
    q, k = grid(g, (B, H, Tq, d), -32, 32), grid(g, (B, H, Tk, d), -8, 8)
    q[..., 0] = torch.randint(-1000, 1001, (B, H, Tq), generator=g) * d ** 0.5
    k[..., 0] = 1.0
    return q, k, torch.randn(B, H, Tk, d, generator=g)


@st.composite
def flash_scenarios(draw):
    """Batch rows, heads and head dims unlike tiny's; tiles of 1 up to larger than the sequence; Tk around the key tile,
    Tq around the query tile and Tk (0 included; Tq > Tk: an error with the mask, allowed without); scores near unit
    scale or shifted by up to +-1000."""
    far = draw(st.booleans())
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    d = draw(st.sampled_from([4, 16] if far else [1, 2, 3, 4, 8, 16]))
    block_q, block_k = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64])), draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64]))
    causal = draw(st.booleans())
    Tk = draw(around(block_k, 8, low=1, high=40))
    Tq = draw(around(block_q, Tk - 1, Tk, Tk + 1, low=0, high=40))
    defaults = draw(st.integers(0, 3)) == 0  # attention() with its default tiles and mask
    return B, H, d, Tq, Tk, block_q, block_k, causal, far, defaults, draw(st.integers(0, 2 ** 16))


class CountingHBM(memory.HBM):
    """workshop.attention.HBM that also adds up the bytes loaded and stored per tensor name."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read_of, self.written_of = {}, {}

    def load(self, name, start, stop):
        tile = super().load(name, start, stop)
        self.read_of[name] = self.read_of.get(name, 0) + tile.numel() * tile.element_size()
        return tile

    def store(self, name, start, tile):
        super().store(name, start, tile)
        self.written_of[name] = self.written_of.get(name, 0) + tile.numel() * tile.element_size()


def observe_flash(flash_attention, q, k, v, block_q, block_k, causal):
    """flash_attention through a byte-counting HBM: the output, the bytes of q read and of o written (each tile once:
    exact), the names loaded and stored, the total against workshop.attention.flash_attention_bytes, and whether every
    tensor it creates stays within a few tiles."""
    hbm = CountingHBM(q, k, v, causal)
    (B, H, Tq, d), Tk = q.shape, k.shape[2]
    with memory.LargestTensor(*hbm.tensors.values()) as largest:
        flash_attention(hbm, block_q, block_k)
    tile_q, tile_k = min(block_q, max(Tq, 1)), min(block_k, Tk)
    formula = memory.flash_attention_bytes(B, H, Tq, Tk, d, block_q, block_k, causal, q.element_size())
    return {"hbm.output": hbm.output, "bytes of q loaded": hbm.read_of.get("q", 0), "bytes of o stored": hbm.written_of.get("o", 0),
            "names loaded, names stored": (sorted(hbm.read_of), sorted(hbm.written_of)),
            "bytes moved <= flash_attention_bytes": hbm.bytes_moved <= formula,
            "every tensor created within a few tiles": largest.numel <= 2 * B * H * max(tile_q, tile_k) * max(tile_k, d)}


def test_10b_differential(student, seed):
    """Generated shapes and tiles (Tq 0 and 1, lengths at and one either side of the tiles, tiles of 1 and larger than
    the sequence, Tq > Tk with and without the mask, heads and head dims unlike tiny's, scores near +-1000) through a
    byte-counting HBM: the output, the bytes of q and o moved, the names loaded and stored, the bytes against the
    formula and the working set; the same tiles again with one more key (nothing carried over from the call before),
    then attention() on the first tensors; the error class where there is one."""
    def check(scenario):
        B, H, d, Tq, Tk, block_q, block_k, causal, far, defaults, g_seed = scenario
        q, k, v = flash_inputs(B, H, d, Tq, Tk, far, g_seed)
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, flash_attention, hints 1-3.", tol=FAR if far else TIGHT)
        shapes = (f"q [{B}, {H}, {Tq}, {d}], k, v [{B}, {H}, {Tk}, {d}]" + (", scores shifted by up to +-1000, each query's "
                  "by its own amount" if far else ""))
        twins.call(f"flash_attention(HBM({shapes}, causal={causal}), block_q={block_q}, block_k={block_k})",
                   lambda side, q, k, v: observe_flash(side.flash_attention, q, k, v, block_q, block_k, causal),
                   inputs=(q, k, v), again=True)
        # the same tiles on a problem with one more key before the queries: nothing kept from the call before may carry over
        q2, k2, v2 = flash_inputs(B, H, d, Tq, Tk + 1, far, g_seed + 1)
        twins.call(f"flash_attention(HBM(q [{B}, {H}, {Tq}, {d}], k, v [{B}, {H}, {Tk + 1}, {d}], causal={causal}), "
                   f"block_q={block_q}, block_k={block_k}) (the same tiles, one key more)",
                   lambda side, q, k, v: observe_flash(side.flash_attention, q, k, v, block_q, block_k, causal), inputs=(q2, k2, v2))
        if defaults:
            twins.call("attention(q, k, v)", lambda side, q, k, v: side.attention(q, k, v), inputs=(q, k, v))
        else:
            twins.call(f"attention(q, k, v, block_q={block_q}, block_k={block_k}, causal={causal})",
                       lambda side, q, k, v: side.attention(q, k, v, block_q, block_k, causal), inputs=(q, k, v))

    explore(flash_scenarios(), check, seed=seed, examples=50, edges=FLASH_EDGES)


# Tried first at every seed (issue 41): no query at all; queries and keys exact multiples of the tiles, causal, scores
# shifted by +-1000; one query more than keys with the mask (refused) and without it (well defined); one query, tiles
# larger than the sequence and Tk one past a key tile, the defaults.
FLASH_EDGES = [
    (1, 1, 4, 0, 5, 4, 4, False, False, False, 0),
    (2, 3, 16, 8, 8, 4, 4, True, True, False, 1),
    (1, 1, 1, 6, 5, 2, 3, True, False, False, 2),
    (1, 2, 2, 6, 5, 4, 2, False, False, False, 4),
    (1, 2, 3, 1, 9, 64, 8, True, False, True, 3),
]


@st.composite
def merge_scenarios(draw):
    """1 to 9 partials (1 and 2 often) over leading dims of several shapes; log-sum-exps near 0, all near +1000 or
    -1000, or spread over -1000, 0 and 1000 (the small ones weigh exactly 0)."""
    n = draw(around(1, 2, 4, low=1, high=9))
    lead = draw(st.sampled_from([(1,), (3,), (2, 3), (2, 3, 1)]))
    return n, lead, draw(st.sampled_from([1, 2, 8])), draw(st.sampled_from([0, 0, 1000, -1000, "spread"])), draw(st.integers(0, 2 ** 16))


def test_10c_differential_merge(student, seed):
    """Generated partial results merged: the output and the log-sum-exp with their shapes and dtypes against the
    reference's (FAR_TOL where the lses are far from 0), a single partial included."""
    def check(scenario):
        n, lead, d, shift, g_seed = scenario
        g = torch.Generator().manual_seed(g_seed)
        outputs, lses = torch.randn(n, *lead, d, generator=g), grid(g, (n, *lead), -40, 40)
        lses += torch.tensor([-1000.0, 0.0, 1000.0])[torch.randint(3, (n, *lead), generator=g)] if shift == "spread" else shift
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, merge_partials, hints 1 and 2.", tol=TIGHT if shift == 0 else FAR)
        merge = lambda side, o, l: side.merge_partials(o, l)
        if n == 1:  # one partial may come back as it is (tests/alternatives/ex10_two_streams.py): a copy, for the storage check
            merge = lambda side, o, l: (lambda r: type(r)(t.clone() for t in r))(side.merge_partials(o, l))
        twins.call(f"merge_partials(outputs [{n}, {', '.join(map(str, lead))}, {d}], lses {lses.tolist()})", merge,
                   inputs=(outputs, lses), again=True)

    explore(merge_scenarios(), check, seed=seed, examples=40, edges=MERGE_EDGES)


# Tried first at every seed (issue 41): a single partial of width 1; two spread over -1000, 0 and 1000 (the small ones
# weigh exactly 0); nine, all near -1000.
MERGE_EDGES = [(1, (1,), 1, 0, 0), (2, (2, 3, 1), 8, "spread", 1), (9, (3,), 2, -1000, 2)]


@st.composite
def decoding_scenarios(draw):
    """One query over T keys (1 included), chunk sizes of 1, around T and larger than T, T at and one either side of
    chunk multiples; heads and head dims unlike tiny's; scores near unit scale or shifted by up to +-1000."""
    far = draw(st.booleans())
    B, H, d = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.sampled_from([4, 16] if far else [1, 2, 3, 8]))
    chunk = draw(st.sampled_from([1, 2, 3, 4, 8, 37]))
    T = draw(around(chunk, 3 * chunk, low=1, high=80))
    chunk = draw(st.one_of(st.just(chunk), st.sampled_from([max(T - 1, 1), T, T + 1])))
    return B, H, d, T, chunk, far, draw(st.integers(0, 2 ** 16))


def test_10c_differential_decoding(student, seed):
    """Generated decode steps: flash_decoding's output (shape, dtype, values) against the reference's, a fresh tensor."""
    def check(scenario):
        B, H, d, T, chunk, far, g_seed = scenario
        q, k, v = flash_inputs(B, H, d, 1, T, far, g_seed)
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, flash_decoding.", tol=FAR if far else TIGHT)
        twins.call(f"flash_decoding(q [{B}, {H}, 1, {d}], k, v [{B}, {H}, {T}, {d}], chunk_size={chunk})"
                   + (", scores shifted by up to +-1000" if far else ""),
                   lambda side, q, k, v: side.flash_decoding(q, k, v, chunk), inputs=(q, k, v), again=True)

    explore(decoding_scenarios(), check, seed=seed, examples=40, edges=DECODING_EDGES)


# Tried first at every seed (issue 41): one key in chunks of 1; exactly two chunks, scores shifted by +-1000; one key past
# a chunk; a chunk one larger than the keys.
DECODING_EDGES = [(1, 1, 1, 1, 1, False, 0), (2, 3, 16, 8, 4, True, 1), (1, 2, 3, 9, 8, False, 2), (1, 1, 8, 37, 38, False, 3)]


@st.composite
def paged_scenarios(draw):
    """Blocks of 1, 2, 3, 4 or 8 slots; lengths ending exactly on a block edge (often), one short of it, or one past
    the previous; runs of 1 block up to more than the sequence has; 0 to 2 spare table entries; the table a list or
    a tensor; heads and head dims unlike tiny's; scores near unit scale or shifted by up to +-1000."""
    far = draw(st.booleans())
    H, d = draw(st.integers(1, 3)), draw(st.sampled_from([4, 16] if far else [1, 2, 4, 8]))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    needed = draw(around(1, 2, 3, low=1, high=9))
    length = needed * block_size - min(draw(st.sampled_from([0, 0, 1, block_size - 1])), block_size - 1)
    blocks_per_chunk = max(1, draw(st.one_of(st.integers(1, 3), st.sampled_from([needed - 1, needed, needed + 1]))))
    spare, extra, as_tensor = draw(st.integers(0, 2)), draw(st.integers(0, 3)), draw(st.booleans())
    return H, d, block_size, needed, length, blocks_per_chunk, spare, extra, as_tensor, far, draw(st.integers(0, 2 ** 16))


def paged_inputs(H, d, block_size, needed, length, spare, extra, far, g_seed):
    """q [H, d]; pools of large garbage with the sequence's keys and values at its slots through a shuffled table of
    needed + spare entries; NaN past the length in its last block and in the spare blocks (stale memory)."""
    g = torch.Generator().manual_seed(g_seed)
    num_blocks = needed + spare + extra
    pool_k = torch.randn(num_blocks, block_size, H, d, generator=g) * 50
    pool_v = torch.randn(num_blocks, block_size, H, d, generator=g) * 50 + 100
    table = torch.randperm(num_blocks, generator=g)[:needed + spare].tolist()
    q, k, v = flash_inputs(1, H, d, 1, length, far, g_seed + 1)
    q, k, v = q[0, :, 0], k[0].transpose(0, 1), v[0].transpose(0, 1)  # [H, d]; [length, H, d]
    for p in range(length):
        pool_k[table[p // block_size], p % block_size], pool_v[table[p // block_size], p % block_size] = k[p], v[p]
    for pool in (pool_k, pool_v):
        pool[table[needed - 1], length - (needed - 1) * block_size:] = float("nan")
        pool[table[needed:]] = float("nan")
    return q, pool_k, pool_v, table


def observe_paged(paged_flash_decoding, q, pool_k, pool_v, table, length, blocks_per_chunk):
    """paged_flash_decoding under workshop.attention's probes: the output, the blocks read from each pool, whether any
    element was read twice, and whether every tensor it creates stays within about one chunk."""
    with memory.LargestTensor(pool_k, pool_v) as largest, memory.BlocksRead(pool_k, pool_v) as reads:
        out = paged_flash_decoding(q, pool_k, pool_v, table, length, blocks_per_chunk)
    (H, d), block_size = q.shape, pool_k.shape[1]
    chunks = -(-length // (blocks_per_chunk * block_size))
    return {"output": out, "blocks read from key_pool": reads.blocks(0), "blocks read from value_pool": reads.blocks(1),
            "no element read twice": max(reads.most_reads(0), reads.most_reads(1)) <= 1,
            "every tensor created within about one chunk": largest.numel <= 2 * max(blocks_per_chunk * block_size * H * d,
                                                                                    chunks * H * d, len(table))}


def test_10c_differential_paged(student, seed):
    """Generated paged decode steps: the output, the blocks read from each pool (exactly the first ceil(length /
    block_size) table entries), each element once, and the working set, against the reference's."""
    def check(scenario):
        H, d, block_size, needed, length, blocks_per_chunk, spare, extra, as_tensor, far, g_seed = scenario
        q, pool_k, pool_v, table = paged_inputs(H, d, block_size, needed, length, spare, extra, far, g_seed)
        given = torch.tensor(table) if as_tensor else table
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, paged_flash_decoding, hints 1 and 2.", tol=FAR if far else TIGHT)
        twins.call(f"paged_flash_decoding(q [{H}, {d}], pools of {pool_k.shape[0]} blocks of {block_size}, block_table="
                   f"{'torch.tensor(' if as_tensor else ''}{table}{')' if as_tensor else ''} (its first {needed} entries the "
                   f"sequence's), length={length}, blocks_per_chunk={blocks_per_chunk})" + (", scores shifted by up to +-1000" if far else ""),
                   lambda side, q, k, v, t: observe_paged(side.paged_flash_decoding, q, k, v, t, length, blocks_per_chunk),
                   inputs=(q, pool_k, pool_v, given), again=True)

    explore(paged_scenarios(), check, seed=seed, examples=50, edges=PAGED_EDGES)


# Tried first at every seed (issue 41): one block of one slot; a length exactly on a block edge, a run as long as the
# sequence, two spare entries, the table a tensor, scores shifted by +-1000; one past the previous block edge in runs of
# 2 blocks that do not divide 3; one short of a block edge, a run longer than the sequence.
PAGED_EDGES = [
    (1, 1, 1, 1, 1, 1, 0, 0, False, False, 0),
    (3, 16, 4, 3, 12, 3, 2, 1, True, True, 1),
    (2, 4, 3, 3, 7, 2, 0, 0, False, False, 2),
    (1, 2, 8, 2, 15, 4, 1, 0, True, False, 3),
]


@st.composite
def packed_scenarios(draw):
    """Exercise 5's packed batches of 1 to 3 sequences, each a chunk of new tokens (1 often) after cached ones (0
    included), lengths at and around block edges, blocks of 1, 3 or 4, spare table entries; a small model's sizes;
    blocks_per_chunk at its default or not."""
    config = draw(small_config(max_layers=2))
    block_size = draw(st.sampled_from([1, 3, 4]))
    seqs = draw(st.lists(st.tuples(around(1, block_size, low=1, high=9), around(block_size, 2 * block_size, low=0, high=20),
                                   st.integers(0, 2)), min_size=1, max_size=3))
    blocks_per_chunk = draw(st.sampled_from([None, 1, 3, 8]))
    return config, block_size, seqs, blocks_per_chunk, draw(st.integers(0, config.n_layer - 1)), draw(st.integers(0, 2 ** 16))


def packed_inputs(config, block_size, seqs, g_seed):
    """Every layer's pools (random; NaN in block 0, the padding of short tables, in the spare entries' blocks and past
    each sequence's length), exercise 5's PackedBatch and the packed queries."""
    g = torch.Generator().manual_seed(g_seed)
    H, hd = config.n_head, config.n_embd // config.n_head
    tables, needed = [], [-(-(start + new) // block_size) for new, start, _ in seqs]
    num_blocks = 1 + sum(n + spare for n, (_, _, spare) in zip(needed, seqs))
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    for n, (_, _, spare) in zip(needed, seqs):
        tables.append([free.pop() for _ in range(n + spare)])
    keys = [torch.randn(num_blocks, block_size, H, hd, generator=g) for _ in range(config.n_layer)]
    values = [torch.randn(num_blocks, block_size, H, hd, generator=g) for _ in range(config.n_layer)]
    for pool in keys + values:
        pool[0] = float("nan")
        for table, n, (new, start, _) in zip(tables, needed, seqs):
            pool[table[n - 1], start + new - (n - 1) * block_size:] = float("nan")
            pool[table[n:]] = float("nan")
    _, _, batch = ex5.pack([[0] * new for new, _, _ in seqs], [start for _, start, _ in seqs], tables, block_size, "cpu")
    return torch.randn(len(batch.slots), H, hd, generator=g), keys, values, batch, tables


def observe_packed(flash_paged_attention, q, keys, values, batch, layer, blocks_per_chunk):
    """flash_paged_attention on an exercise 5 cache of these pools: the output, the blocks of the layer's pools read,
    and whether every tensor it creates stays within about one chunk (or the output)."""
    cache = ex5.PagedKVCache.__new__(ex5.PagedKVCache)
    cache.keys, cache.values = keys, values
    with memory.LargestTensor(q, *keys, *values, *vars(batch).values()) as largest, \
            memory.BlocksRead(keys[layer], values[layer]) as reads:
        out = (flash_paged_attention(q, cache, layer, batch) if blocks_per_chunk is None
               else flash_paged_attention(q, cache, layer, batch, blocks_per_chunk))
    H, hd, block_size, keys_seen = q.shape[1], q.shape[2], keys[0].shape[1], batch.mask.shape[-1]
    chunk = (blocks_per_chunk or 2) * block_size
    limit = 2 * max(H * hd * max(len(q), -(-keys_seen // chunk), chunk), keys_seen)
    return {"output": out, "blocks read from the layer's keys": reads.blocks(0), "blocks read from its values": reads.blocks(1),
            "every tensor created within about one chunk, or the output": largest.numel <= limit}


def test_10d_differential(student, seed):
    """Generated packed batches (a small model's heads and head dims, blocks of 1, 3, 4, chunks ending on block edges,
    spare table entries, NaN wherever no query may look): the output, the blocks read and the working set, against
    the reference's flash_paged_attention; blocks_per_chunk at its default and not."""
    def check(scenario):
        config, block_size, seqs, blocks_per_chunk, layer, g_seed = scenario
        q, keys, values, batch, tables = packed_inputs(config, block_size, seqs, g_seed)
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, flash_paged_attention, hints 1 and 2.", tol=TIGHT)
        plan = ", ".join(f"{new} new after {start} cached, table {t}" for (new, start, _), t in zip(seqs, tables))
        twins.call(f"flash_paged_attention(q [{len(q)}, {config.n_head}, {config.n_embd // config.n_head}], a cache of "
                   f"{config.n_layer} layers' pools of blocks of {block_size}, layer={layer}, a batch of: {plan}"
                   + (f", blocks_per_chunk={blocks_per_chunk})" if blocks_per_chunk else ")"),
                   lambda side, q, k, v, b: observe_packed(side.flash_paged_attention, q, k, v, b, layer, blocks_per_chunk),
                   inputs=(q, keys, values, batch), again=True)

    explore(packed_scenarios(), check, seed=seed, examples=30, edges=PACKED_EDGES)


# Tried first at every seed (issue 41): one new token with nothing cached, a block's worth after a full block (spare
# entries), one token ending one short of a block edge, in the last layer; one head, blocks of one slot, chunks of one
# block; a chunk after 20 cached positions, a chunk larger than the sequence.
_TWO_HEADS = gpt.GPTConfig(n_positions=32, n_embd=8, n_layer=2, n_head=2)
_ONE_HEAD = gpt.GPTConfig(n_positions=32, n_embd=4, n_layer=1, n_head=1)
PACKED_EDGES = [
    (_TWO_HEADS, 4, [(1, 0, 0), (4, 4, 2), (1, 6, 0)], None, 1, 0),
    (_ONE_HEAD, 1, [(9, 0, 1)], 1, 0, 1),
    (_TWO_HEADS, 3, [(3, 20, 0)], 8, 0, 2),
]


class Probe(Exception):
    """Raised inside use_flash_decoding's `with`, to see exercise 5's attention restored after an error too."""


def observe_engine(use_flash_decoding, model, plan, blocks_per_chunk, options):
    """Exercise 5's reference engine run inside use_flash_decoding: each request's greedy tokens (near ties
    tolerated), whether paged_attention was replaced inside the `with`, and restored after it (after an error too)."""
    requests = [ex5.Request(list(p), n, arrival_step=a) for p, n, a in plan]
    enter = (lambda: use_flash_decoding(ex5)) if blocks_per_chunk is None else (lambda: use_flash_decoding(ex5, blocks_per_chunk))
    try:
        with enter():
            replaced = ex5.paged_attention is not GATHER_PATH
            result = ex5.generate(model, requests, 2, eos_token_id=-1, **options)
        restored = ex5.paged_attention is GATHER_PATH
        try:
            with enter():
                raise Probe
        except Probe:
            pass
        restored_after_error = ex5.paged_attention is GATHER_PATH
    finally:
        ex5.paged_attention = GATHER_PATH
    return {"each request's tokens": [GreedyTokens(out, model, tuple(p)) for out, (p, _, _) in zip(result.outputs, plan)],
            "replaced inside the with": replaced, "restored after it": restored, "restored after an error": restored_after_error}


@st.composite
def engine_scenarios(draw):
    """A small random model, 1 to 3 requests (prompt lengths around the block size, late arrivals), blocks of 1, 3 or
    4, a small step budget, blocks_per_chunk at its default or not."""
    config, block_size = draw(small_config(max_layers=2)), draw(st.sampled_from([1, 3, 4]))
    plan = draw(st.lists(st.tuples(prompts(block_size, 2 * block_size, min_len=1, max_len=10), st.integers(1, 5),
                                   st.integers(0, 2)), min_size=1, max_size=3))
    return config, block_size, plan, draw(st.sampled_from([None, 1, 3])), draw(st.sampled_from([4, 6, 64]))


def test_10d_differential_engine(student, seed):
    """Exercise 5's engine on generated requests under your use_flash_decoding and under the reference's: the same
    greedy tokens for every request, the engine's attention replaced inside the `with` and restored after it."""
    def check(scenario):
        config, block_size, plan, blocks_per_chunk, budget = scenario
        model = small_model(config)
        options = dict(block_size=block_size, max_num_batched_tokens=budget)
        twins = Twins(reference, student, hint=f"Hint: see {HINTS}, flash_paged_attention, hint 2.")
        twins.call(f"with use_flash_decoding(ex5{f', {blocks_per_chunk}' if blocks_per_chunk else ''}): ex5.generate(a model "
                   f"of {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}; requests (prompt, max_new_tokens, "
                   f"arrival_step) {plan}, max_batch_size=2, eos_token_id=-1, {options})",
                   lambda side: observe_engine(side.use_flash_decoding, model, plan, blocks_per_chunk, options))

    explore(engine_scenarios(), check, seed=seed, examples=6, edges=ENGINE_EDGES)


# Tried first at every seed (issue 41), one scenario (an engine run is the costly kind): a prompt of exactly one block
# (id 0) and a late one of EOS, blocks of 3, chunks of one block, a step budget of 4.
ENGINE_EDGES = [(_ONE_HEAD, 3, [([0, 1, 2], 2, 0), ([50256] * 4, 1, 1)], 1, 4)]
