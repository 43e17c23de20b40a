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

import solutions.ex5_paged_kv_cache as ex5
from workshop import attention as memory
from workshop.grading.harness import describe_token_mismatch, implementation
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex10.md"
MASK_NAME = " with exercise 2's lower-right mask"
TOL = 2e-5  # fp32: the order of the additions differs from SDPA's, nothing else may
FAR_TOL = 1e-3  # scores near +-1000: fp32 numbers there are 6e-5 apart, so a correct design that keeps log-sum-exps
#                 (not a max and a sum) is exact to ~1e-4; the bugs these inputs catch give NaN, inf or 0


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
