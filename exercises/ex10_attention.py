"""Exercise 10: attention kernels, FlashAttention for prefill, Flash-Decoding for decode.

Attention is softmax(Q K^T / sqrt(d)) V. Written as three steps it materialises the T x T scores in
the GPU's slow memory (HBM) and reads them back twice: for long sequences those bytes, not the
arithmetic, set the time (attention is memory-bound). FlashAttention (Dao et al., 2022) never writes
the scores: it walks over tiles of keys and values, keeping for each query only a running max, a
running sum and a running output, rescaled whenever the max grows (the online softmax). The decode
step has one query per sequence: one tile of queries, nothing to run in parallel but the keys, so
Flash-Decoding (Dao et al., 2023) splits the keys into chunks, attends to each on its own, and merges
the partial outputs with their log-sum-exps. Serving engines run it over the paged KV blocks.

The parts, each graded on its own:
  10a softmax_stats: the online softmax, a row's max and sum of exponentials from its chunks
  10b flash_attention: the tiled forward, through workshop.attention.HBM, which counts the bytes moved
  10c merge_partials, flash_decoding, paged_flash_decoding: split-KV decoding, contiguous and paged
  10d flash_paged_attention: exercise 5's paged_attention done by 10c, for exercise 5's engine

Stuck? exercises/hints/ex10.md has hints for each TODO, from the idea to near-code: open one at a time.
Check your work with:  pytest exercises/test_ex10_attention.py      (one part: -k 10a, -k 10b, -k 10c, -k 10d)
"""

import contextlib
import math

import torch

from gpt import check_indices
from workshop.attention import HBM  # the memory model 10b works through (given)

NEG_INF = float("-inf")

# ----------------------------------------------------------------------------------------------
# 10a: the online softmax


def softmax_stats(chunks):
    """The softmax statistics of rows seen one chunk at a time. chunks: an iterable of tensors [R, n_i],
    the columns of the same R rows from left to right, each chunk seen once. Returns (m, l), each [R]:
    m the max of each row, l = sum over the row of exp(x - m). A row of only -inf: m = -inf, l = 0."""
    # TODO (exercise 10a): the contract:
    #   - returns (m, l), each [R] (the rows' dtype): m = max of each whole row, l = sum of exp(x - m) over it,
    #     equal (fp32, tight tolerance) to what the whole row at once gives.
    #   - `chunks` is an iterator: each chunk is seen ONCE, left to right; keep only O(R) numbers between
    #     chunks (no list of chunks, no concatenation): the checker measures the largest tensor you create and
    #     whether a chunk you have folded in is let go. Chunks may be one column wide.
    #   - the traps: the max of the chunks seen so far changes as chunks arrive, and what you summed before
    #     was relative to the old one; exp must never overflow nor underflow to 0 (rows may hold values like
    #     +-1000, or lie wholly below zero: the running max starts at -inf, not 0); a row that is -inf in every
    #     column seen so far (or in all of them: then m = -inf, l = 0) must not become NaN.
    raise NotImplementedError("Exercise 10: implement softmax_stats() in exercises/ex10_attention.py (10a): each row's "
                              "max and sum of exp(x - max), updated chunk by chunk.")


def online_softmax(x, chunk_size):
    """Given: softmax of x [R, n] along its rows, from the statistics of chunk_size columns at a time."""
    m, l = softmax_stats(x.split(chunk_size, dim=-1))
    return torch.exp(x - m[:, None]) / l[:, None]


# ----------------------------------------------------------------------------------------------
# 10b: FlashAttention, forward


def flash_attention(hbm, block_q, block_k):
    """Attention of hbm's q over its k, v (causal or not, as hbm.causal says: exercise 2's lower-right mask),
    in tiles of block_q queries and block_k keys, never materialising the scores: every output row
    stored in hbm's "o". Equal to SDPA; moves at most workshop.attention.flash_attention_bytes."""
    # TODO (exercise 10b): the contract:
    #   - reach q, k, v ONLY through hbm.load(name, start, stop) (rows start..stop-1 of the sequence axis, every
    #     batch row and head at once) and write the output only with hbm.store("o", start, tile); anything you
    #     keep in local variables between them is "fast memory": no tensor larger than a few tiles (the checker
    #     measures the largest one you create), never a [Tq, Tk] score matrix or mask, never all of K.
    #   - hbm.output equals F.scaled_dot_product_attention(q, k, v) (scale 1/sqrt(d)) with exercise 2's
    #     lower-right causal mask when hbm.causal (query i sits at position Tk - Tq + i), no mask otherwise;
    #     fp32, tight tolerance. Any block sizes >= 1; Tq and Tk need not be multiples of them.
    #   - bytes moved (hbm.bytes_moved) at most workshop.attention.flash_attention_bytes(...): each Q tile read
    #     once and its O tile written once; per Q tile, only the K/V tiles its queries can see (causal: the
    #     tiles wholly after its last query's position are skipped, not loaded and masked).
    #   - the traps: the running max changes from tile to tile; scores may be far from zero either way, each
    #     query's by its own amount (+-1000: no overflow, no row whose exps all underflow to 0; a max per query
    #     row, starting at -inf); inside a tile that crosses the diagonal, positions are global (tile offsets
    #     and Tk - Tq), not tile-local.
    raise NotImplementedError("Exercise 10: implement flash_attention() in exercises/ex10_attention.py (10b): tiles of "
                              "queries over tiles of keys, a running max, sum and output per query, through hbm.")


def attention(q, k, v, block_q=64, block_k=64, causal=True):
    """Given: flash_attention on tensors: q [B, H, Tq, d], k, v [B, H, Tk, d] -> [B, H, Tq, d]."""
    hbm = HBM(q, k, v, causal)
    flash_attention(hbm, block_q, block_k)
    return hbm.output


# ----------------------------------------------------------------------------------------------
# 10c: Flash-Decoding (split-KV)


def merge_partials(outputs, lses):
    """Merge the partial attentions of chunks of the same keys. outputs: [n, ..., d] (chunk c's output,
    normalised over its own keys), lses: [n, ...] (chunk c's log-sum-exp of scores). Returns (output
    [..., d], lse [...]): what attention over all the chunks' keys together gives."""
    # TODO (exercise 10c): the contract: partial results of the SAME queries over disjoint chunks of keys
    # -> the result over all of them (output [..., d] and its log-sum-exp [...]), for any number n >= 1 of
    # chunks of any sizes, in any order; fp32, tight tolerance; no overflow nor 0/0 when the lses are far from
    # zero either way (e.g. all near 1000, or all near -1000).
    # The trap: a chunk's weight in the whole softmax is not its share of the keys.
    raise NotImplementedError("Exercise 10: implement merge_partials() in exercises/ex10_attention.py (10c): combine "
                              "chunks' partial outputs by their log-sum-exps.")


def flash_decoding(q, k, v, chunk_size):
    """Decode attention split over the keys: q [B, H, 1, d] (one query per sequence, which sees every key),
    k, v [B, H, T, d], T cut into chunks of chunk_size keys (the last may be shorter), each attended on
    its own, then merged. Returns [B, H, 1, d], equal to SDPA."""
    # TODO (exercise 10c): the contract: equal (fp32, tight tolerance) to F.scaled_dot_product_attention(q, k, v)
    # (no mask: the decoding query is the last position). The keys go in chunks of chunk_size, the last one
    # possibly shorter, each attended on its own (on a GPU: in parallel) and then merged (merge_partials).
    # Scores may be far from zero (+-1000): a chunk's log-sum-exp must not overflow or underflow either.
    raise NotImplementedError("Exercise 10: implement flash_decoding() in exercises/ex10_attention.py (10c): attend to "
                              "each chunk of keys, then merge the partial results.")


def check_paged_call(key_pool, block_table, length, blocks_per_chunk):
    """Given: paged_flash_decoding's arguments checked on the host before any kernel reads the pool with them (out of
    range, a GPU's index kernel asserts and the process dies): a ValueError naming the value and the limit."""
    block_size, num_blocks = key_pool.shape[1], key_pool.shape[0]
    if blocks_per_chunk < 1 or not 1 <= length <= len(block_table) * block_size:
        raise ValueError(f"length={length}, blocks_per_chunk={blocks_per_chunk}, a table of {len(block_table)} blocks of {block_size}: "
                         f"the length must be 1 to {len(block_table) * block_size} and a chunk at least one block.")
    used = block_table[:-(-length // block_size)]  # the blocks the sequence's keys are in (a CPU tensor's are checked)
    check_indices(used if isinstance(used, torch.Tensor) else list(used), num_blocks, "block_table entry",
                  f"the pool has {num_blocks} blocks")


def paged_flash_decoding(q, key_pool, value_pool, block_table, length, blocks_per_chunk):
    """Flash-Decoding over exercise 5's paged pool: q [H, d], the query of one sequence at position
    length - 1; key_pool, value_pool [num_blocks, block_size, H, d]; block_table: the sequence's physical
    blocks in order (a list or 1-D tensor, possibly longer than needed), of which the first `length`
    slots hold its keys. Each chunk is a run of blocks_per_chunk blocks, read from the pool on its own:
    never the whole sequence at once, and no slot at or past `length`. Returns [H, d]."""
    check_paged_call(key_pool, block_table, length, blocks_per_chunk)  # given
    # TODO (exercise 10c): the contract:
    #   - equal (fp32, tight tolerance) to SDPA of q over the sequence's first `length` keys and values, in
    #     position order (position p lives at slot p % block_size of block block_table[p // block_size]).
    #   - each chunk is a run of blocks_per_chunk consecutive table entries (the last run may be shorter);
    #     every tensor you create stays about one chunk's size (the checker measures the largest): never the
    #     whole sequence's keys at once.
    #   - read from the pools only the sequence's blocks, the first ceil(length / block_size) table entries
    #     (also when the length is an exact multiple of the block size), each once: the checker records which
    #     blocks you read (workshop.attention.BlocksRead).
    #   - slots at or past `length` (the rest of the last block, the table's later entries, other blocks of
    #     the pool) hold someone else's data, any bits, NaN included: they must not count (a weight of 0 times
    #     a NaN value is NaN).
    raise NotImplementedError("Exercise 10: implement paged_flash_decoding() in exercises/ex10_attention.py (10c): "
                              "Flash-Decoding over runs of the block table's blocks.")


# ----------------------------------------------------------------------------------------------
# 10d: exercise 5's engine on Flash-Decoding


def flash_paged_attention(q, cache, layer, batch, blocks_per_chunk=2):
    """Exercise 5's paged_attention(q, cache, layer, batch) done with paged_flash_decoding: each query of
    the packed batch q [N, n_head, head_dim] attends to its sequence's keys up to its own position (a
    prompt chunk's queries each see one more than the one before), found through batch.block_tables,
    never gathered whole. Returns [N, n_head, head_dim], equal to exercise 5's gather path."""
    # TODO (exercise 10d): the contract: the same as exercise 5's paged_attention (read it: what q, cache and
    # batch hold, how batch.block_tables, batch.query_index, batch.query_valid and batch.mask describe the
    # packed sequences), computed by paged_flash_decoding instead of a gather of whole sequences: every query
    # of a sequence sees its keys up to its own position (a prompt chunk's queries see one key more each).
    # The checker measures the largest tensor you create (about one chunk, or the output) and the blocks you
    # read: only those the queries' lengths need, never a table's spare entries or its padding.
    # Exercise 5's engine run under use_flash_decoding gives the same tokens as with its own gather path.
    raise NotImplementedError("Exercise 10: implement flash_paged_attention() in exercises/ex10_attention.py (10d): "
                              "exercise 5's paged attention, each query by paged_flash_decoding.")


@contextlib.contextmanager
def use_flash_decoding(engine_module, blocks_per_chunk=2):
    """Given: inside the `with`, exercise 5's module (its engine, forward and attention_forward) attends with
    flash_paged_attention instead of its own paged_attention; restored afterwards.

        with use_flash_decoding(ex5):
            result = ex5.generate(model, requests, max_batch_size=4)
    """
    original = engine_module.paged_attention
    engine_module.paged_attention = lambda q, cache, layer, batch: flash_paged_attention(q, cache, layer, batch, blocks_per_chunk)
    try:
        yield
    finally:
        engine_module.paged_attention = original
