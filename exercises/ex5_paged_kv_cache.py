"""Exercise 5: the paged KV cache (PagedAttention, as in vLLM, SOSP 2023).

Exercise 4 keeps the running batch's keys and values in one left-padded tensor: every row is as wide
as the longest, and a serving system that reserves each request's whole context up front wastes even
more (vLLM's paper measured only 20-40% of such KV memory holding token states). Paging fixes both,
as an operating system pages memory:

    physical pool   num_blocks blocks of block_size token slots, per layer, allocated once
    block table     per sequence: logical block i (positions i*bs .. i*bs+bs-1) -> a physical block
    on demand       a sequence gets a new block exactly when its last one is full: waste < 1 block
    sharing         a block may have several owners (reference counts): n continuations of one
                    prompt, or later requests with the same prefix (prefix caching)

The parts, each graded on its own:
  5a  BlockAllocator (allocate, free, reference counts) and BlockTable (on-demand blocks, slot mapping)
  5b  PagedKVCache and forward: new keys/values written at their slots, attention through the block
      tables for a packed batch of sequences of any lengths (no padding in storage)
  5c  Engine: exercise 4's continuous batching on the paged cache: one forward per step packing every
      scheduled token, a token budget per step with chunked prefill, preemption by recompute
  5d  sharing: copy-on-write for parallel sampling (n > 1) and prefix caching with chained block hashes
  5e  beam search on the block manager: beams share the prompt's blocks, copy on write when they
      diverge, and give their blocks back when they are pruned

One idea runs through the engine (vLLM v1's): a sequence is its tokens (prompt + output) and the
number of them whose keys and values are in the cache. A step computes some of the rest: the whole
prompt, a chunk of it, a single decode token, or everything again after a preemption. When every
token is computed, the last one's logits give the next token.

Your part, in five pieces graded on their own (pytest exercises/test_ex5_paged_kv_cache.py -k 5a, ...):
  5a  BlockAllocator.allocate, .share, .free; BlockTable.blocks_needed, .append, .slot_mapping
  5b  PagedKVCache.write, pack, paged_attention (forward, which calls them, is given)
  5c  Engine.schedule, Engine.preempt, Engine.step (requests, stats, reserve, run are given)
  5d  copy-on-write in BlockTable.blocks_needed/.append, BlockTable.fork, block_hashes,
      Engine.prefix_hits, and the fork of parallel sampling in Engine.step
  5e  beam_step
Stuck? exercises/hints/ex5.md has hints for each part, from the idea to near-code: open one at a time.
"""

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: F401 (for your paged_attention)

from gpt import EOS_TOKEN_ID, check_index, check_indices, check_request, check_token_ids
from workshop.engine_failure import dies_on_error, refused_when_dead  # given: a step that raised kills the engine
from workshop.serving.sampling import GREEDY, SamplingParams, make_generator  # given code, not exercise 6's answer
from workshop.serving.sampling import sample as sample_tokens

# ----------------------------------------------------------------------------------------------
# 5a: blocks


class NoFreeBlocks(RuntimeError):
    """The pool has no free block left."""


class BlockAllocator:
    """A fixed pool of num_blocks physical KV blocks of block_size slots each. A block is free, or
    owned by ref_counts[block] owners (more than one when shared). Freed blocks are handed out again
    least recently freed first; with prefix caching (5d) a free block keeps its tokens' hash, and so
    stays reusable, until it is handed out again (LRU eviction)."""

    def __init__(self, num_blocks, block_size=16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: a pool needs at least one block of one slot.")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.free_blocks = OrderedDict.fromkeys(range(num_blocks))  # least recently freed first
        self.hash_of_block = {}  # block -> hash of the tokens it holds (5d)
        self.block_of_hash = {}  # and back

    @property
    def num_free_blocks(self):
        return len(self.free_blocks)

    def allocate(self):
        """A free block, now owned once. Raises NoFreeBlocks when none is left."""
        # TODO (exercise 5a): hand out a free block.
        #   - Take the block that has been free the longest: self.free_blocks is ordered, least recently freed first.
        #     Its ref count becomes 1; it is no longer free (never give one block to two owners).
        #   - None free: raise NoFreeBlocks with a sentence saying the pool is exhausted and what frees blocks.
        #   - (5d) If the block still caches a prefix (self.hash_of_block), forget that hash in both dicts: its
        #     contents are about to be overwritten (this is the LRU eviction of the prefix cache).
        raise NotImplementedError("Exercise 5: implement BlockAllocator.allocate() (the least recently freed block, ref count 1; NoFreeBlocks when none is left).")

    def share(self, block):
        """One more owner of `block` (a fork, a prefix-cache hit). A free block can be shared only if it
        still holds cached tokens: it leaves the free list."""
        self.check_block(block)  # given
        # TODO (exercise 5a): one more owner of an owned block: its ref count goes up by one.
        #   - (5d) A FREE block may be shared only if it still caches tokens (it is in self.hash_of_block: a
        #     prefix-cache hit on a freed block): it leaves self.free_blocks. Sharing any other free block is a bug:
        #     raise ValueError.
        raise NotImplementedError("Exercise 5: implement BlockAllocator.share() (one more owner: ref count + 1).")

    def free(self, block):
        """One owner fewer; the last owner's free returns the block to the pool."""
        self.check_block(block)  # given
        # TODO (exercise 5a): one owner fewer.
        #   - Ref count down by one; at zero the block is free again and goes to the END of self.free_blocks
        #     (the most recently freed is handed out last). A cached block keeps its hash while free.
        #   - Freeing a free block is a bug (a double free): raise ValueError saying so.
        raise NotImplementedError("Exercise 5: implement BlockAllocator.free() (ref count - 1; at 0 the block returns to the end of the free list).")

    def check_block(self, block):
        """Given: a block id outside the pool is refused here, on the host (InvalidIndex, a ValueError): it would index
        ref_counts (a negative one wraps to another block) and then the KV pool, where a GPU asserts and dies."""
        check_index(block, self.num_blocks, "block", f"the pool has {self.num_blocks} blocks; give an id allocate() handed out")

    # 5d: prefix caching
    def cached_block(self, block_hash):
        """The block that holds the tokens with this hash, or None."""
        return self.block_of_hash.get(block_hash)

    def cache(self, block, block_hash):
        """Remember that `block` (full) holds the tokens with this hash."""
        if block_hash not in self.block_of_hash and block not in self.hash_of_block:
            self.block_of_hash[block_hash], self.hash_of_block[block] = block, block_hash


class BlockTable:
    """One sequence's pages: blocks[i] is the physical block of logical block i, which holds positions
    i*block_size .. i*block_size + block_size - 1. num_tokens positions have a slot."""

    def __init__(self, block_size, blocks=()):
        self.block_size = block_size
        self.blocks = list(blocks)
        self.num_tokens = len(self.blocks) * block_size  # blocks given at the start are full (prefix-cache hits)

    def blocks_needed(self, num_new_tokens, allocator):
        """How many blocks append(num_new_tokens) will allocate: the new blocks, plus one if the last
        block must be copied before it is written (it is partly filled and shared)."""
        # TODO (exercise 5a): how many blocks append(num_new_tokens) will take from the allocator.
        #   - After the append the table holds self.num_tokens + num_new_tokens positions, which need
        #     ceil(that / block_size) blocks; it has len(self.blocks). A block is added exactly when the last one is
        #     FULL: at block_size 4, 8 tokens fit in 2 blocks, the 9th needs a 3rd.
        #   - (5d) Plus one when the last block must be copied first (see append).
        raise NotImplementedError("Exercise 5: implement BlockTable.blocks_needed() (ceil((tokens + new) / block_size) - blocks held).")

    def append(self, num_new_tokens, allocator):
        """Give num_new_tokens more positions a slot: a new block exactly when the last one is full.
        Returns the copies [(src, dst)] the cache must make first (copy-on-write)."""
        # TODO (exercise 5a): give num_new_tokens more positions a slot, allocating blocks on demand.
        #   - num_tokens grows by num_new_tokens; new blocks come from allocator.allocate() until
        #     len(self.blocks) * block_size >= num_tokens, never one more.
        #   - Returns the list of block copies [(src, dst)] the cache must make before writing: [] in 5a.
        #   - (5d) Copy-on-write: the new tokens are written into blocks this table alone owns. A shared, partly
        #     filled last block (allocator.ref_counts[last] > 1) would change its other owners' tokens: the table
        #     moves to a copy of it, the pair (old, copy) is returned so that the cache copies the keys and values
        #     first, and the old block loses this table as an owner (its other owners keep it). Full blocks are never
        #     written again, so they stay shared.
        raise NotImplementedError("Exercise 5: implement BlockTable.append() (a new block exactly when the last one is full).")

    def slot_mapping(self, start, end):
        """The pool slot of each position start .. end-1: physical block * block_size + offset."""
        # TODO (exercise 5a): the pool slot of each position start .. end-1, as a list of ints.
        #   - Position p is in logical block p // block_size at offset p % block_size; its slot is
        #     physical block * block_size + offset.
        raise NotImplementedError("Exercise 5: implement BlockTable.slot_mapping() (physical block * block_size + offset).")

    def fork(self, allocator):
        """5d: a second table sharing every block of this one (parallel sampling)."""
        # TODO (exercise 5d): a new BlockTable holding the same blocks and num_tokens, for a second
        #   continuation of the same prompt. Nothing is copied: every block gets one more owner (allocator.share).
        #   Copies happen later, only if a shared, partly filled block is written (append).
        raise NotImplementedError("Exercise 5: implement BlockTable.fork() (a second table sharing every block: ref counts + 1, nothing copied).")

    def free(self, allocator):
        """Give every block back, the last first: with prefix caching, a shared prefix outlives its tails."""
        for block in reversed(self.blocks):
            allocator.free(block)
        self.blocks, self.num_tokens = [], 0


def block_hashes(token_ids, block_size):
    """5d: the hash of every FULL block of token_ids, each chained with its parent's: a block's hash
    names its tokens AND everything before them, since its keys and values depend on both."""
    # TODO (exercise 5d): one hash per FULL block of token_ids (a partial last block gets none).
    #   - A block's keys and values depend on its tokens AND every token before them, so its hash must too:
    #     chain it, hash((parent's hash, tuple(the block's tokens))), the first block's parent being None.
    #   - Python's hash() of a tuple of ints is the same in every run, which is all this needs.
    raise NotImplementedError("Exercise 5: implement block_hashes() (each full block's hash, chained with its parent's).")


def beam_step(tables, parents, allocator):
    """5e: beam search's blocks for one step (vLLM's reason for reference counts). tables: the live beams'
    BlockTables; parents[j]: the old beam that new beam j extends by one token (several new beams may
    extend one old beam; an old beam that none extends is pruned; fewer new beams than old remain when
    beams finish). Returns (new tables, copies): new beam j shares every block of beam parents[j] and has
    a slot for its new token; copies [(src, dst)] are the block copies the cache makes, in order, before
    the new tokens are written."""
    # TODO (exercise 5e): the block bookkeeping of one beam-search step. When it returns:
    #   - new beam j's table holds beam parents[j]'s tokens and a slot for one more; the beams share every block
    #     they can (a full block is never written again) and no beam can see another's write: a shared, partly
    #     filled block is copied before it is written, and those copies come back in `copies`, in the order the
    #     cache must make them (before this step's tokens are written).
    #   - the old tables own nothing: a pruned beam's blocks are back in the pool, and the pool holds exactly the
    #     blocks the new beams need. Ref counts equal the number of tables holding each block.
    #   - no copy more than needed: a parent's partly filled last block goes to one of its children as it is and
    #     is copied for each other child (k children, k - 1 copies); an only child, or a full last block, copies nothing.
    #   - no block more than needed on the way: the step must run on a pool that holds only the larger of the
    #     blocks the old beams hold and the blocks the new beams need (so nothing is allocated before the old
    #     tables, the pruned beams' among them, have let go).
    #   - Trap: a block that a new beam keeps must never be free on the way (a free block may be handed to someone
    #     else, and sharing a free block that caches nothing is refused).
    raise NotImplementedError("Exercise 5: implement beam_step() (new beams share their parents' blocks, copy on write, pruned beams free theirs).")


# ----------------------------------------------------------------------------------------------
# 5b: the paged cache and the model's forward through it

class PagedKVCache:
    """Every layer's key and value pools, each [num_blocks, block_size, n_head, head_dim], allocated once."""

    def __init__(self, config, num_blocks, block_size, device, dtype=torch.float32):
        shape = (num_blocks, block_size, config.n_head, config.n_embd // config.n_head)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.decode_batch = DecodeBatch(block_size, device)  # given: a decode step's inputs, kept on the device between steps

    def write(self, layer, k, v, slots):
        """Store new keys and values k, v [N, n_head, head_dim] at pool slots [N] (block * block_size + offset)."""
        # given: slots are the caller's to check (forward's check_step checks the block tables they come from): a host read
        # of their values here would make every step wait and break exercise 11's graph capture.
        # TODO (exercise 5b): store the new keys and values of one layer at their slots.
        #   - self.keys[layer] is [num_blocks, block_size, n_head, head_dim]: slot s is block s // block_size,
        #     offset s % block_size. Seen as [num_blocks * block_size, n_head, head_dim] (a view), slot s is row s.
        #   - Write in place (the pool is allocated once), k and v [N, n_head, head_dim] at slots [N].
        raise NotImplementedError("Exercise 5: implement PagedKVCache.write() (keys and values of new tokens into the pool, at their slots).")

    def copy_block(self, src, dst):
        """5d: copy-on-write: block dst gets block src's keys and values, in every layer."""
        for what, block in (("src", src), ("dst", dst)):  # on the host: pool[99] on a GPU is a device-side assert
            check_index(block, len(self.keys[0]), f"copy_block's {what}", f"the pool has {len(self.keys[0])} blocks")
        for pool in self.keys + self.values:
            pool[dst] = pool[src]


@dataclass
class PackedBatch:
    """One step's tokens, all sequences' new tokens side by side (no padding), and what attention
    needs to find each sequence's keys. S sequences, N new tokens in all, L = most blocks * block_size."""
    slots: torch.Tensor  # [N] pool slot of each new token
    block_tables: torch.Tensor  # [S, most blocks] physical blocks (short tables padded with block 0)
    query_index: torch.Tensor  # [S, longest chunk] index into the N tokens of each sequence's queries
    query_valid: torch.Tensor  # [S, longest chunk] False where a short chunk is padded
    mask: torch.Tensor  # [S, 1, longest chunk, L] True where a query may attend: keys at or before its position
    last: torch.Tensor  # [S] index of each sequence's last new token: the one whose logits give a token


def pack(token_ids, start_positions, block_tables, block_size, device):
    """token_ids: each sequence's new tokens (lists); start_positions: the position of each one's first
    new token (= the tokens already cached); block_tables: each one's physical blocks, already covering
    the new tokens. Returns input_ids [1, N], position_ids [1, N] and the PackedBatch."""
    # TODO (exercise 5b): lay one step's work out for the forward (see PackedBatch for every field).
    #   - input_ids and position_ids [1, N]: the sequences' new tokens side by side, no padding. A sequence's
    #     new tokens sit at positions start, start + 1, ...: GPT-2's absolute positions are cache positions.
    #   - slots [N]: each new token's slot, through its own sequence's block table.
    #   - For attention, every sequence's queries are gathered into a padded [S, longest chunk] grid:
    #     query_index (indices into the N tokens; any valid index where a chunk is short), query_valid.
    #   - mask [S, 1, longest chunk, most_blocks * block_size]: key j is visible to a query at position p
    #     exactly when j <= p. The keys come in the sequence's own order through its block table, so that is
    #     the lower-right causal mask of exercise 2 and the key-padding mask at once. A padded query must still
    #     see one key (key 0), or its softmax is all -inf (NaN).
    #   - block_tables [S, most blocks]: each table padded with any block id (masked out).
    #   - last [S]: index of each sequence's last new token among the N.
    raise NotImplementedError("Exercise 5: implement pack() (the step's tokens side by side, their slots, and the attention mask).")


def paged_attention(q, cache, layer, batch):
    """Attention of the packed queries q [N, n_head, head_dim] over their sequences' cached keys and
    values, found through the block tables. Returns [N, n_head, head_dim]."""
    # TODO (exercise 5b): attention of every new token over its own sequence's keys and values.
    #   - Gather each sequence's pages: the pool indexed by batch.block_tables gives
    #     [S, most blocks, block_size, n_head, head_dim]; merge the two block dimensions into one key axis.
    #   - Queries: q[batch.query_index] puts each sequence's queries on its own row, [S, longest, n_head, head_dim].
    #   - F.scaled_dot_product_attention with attn_mask=batch.mask (heads in dimension 1), then the valid
    #     queries back in packed order, [N, n_head, head_dim].
    raise NotImplementedError("Exercise 5: implement paged_attention() (gather the pages by block table, then SDPA with the mask).")


def attention_forward(attn, x, cache, layer, groups):
    """GPTAttention.forward on packed tokens x [1, N, C]: write the new keys and values, then attend. groups:
    [(PackedBatch, the slice of the N tokens it packs)], each attending on its own (see pack_groups)."""
    N, C = x.shape[1], x.shape[2]
    q, k, v = (t.view(N, attn.n_head, C // attn.n_head) for t in attn.c_attn(x[0]).split(C, dim=1))
    y = []
    for batch, tokens in groups:
        cache.write(layer, k[tokens], v[tokens], batch.slots)  # first: a new token attends to itself and to its chunk's earlier tokens
        y.append(paged_attention(q[tokens], cache, layer, batch))
    return attn.c_proj(torch.cat(y).reshape(1, N, C))


def pack_groups(token_ids, start_positions, block_tables, block_size, device):
    """Given: pack() for a step that is not all decode, twice: the sequences with one new token, then those with more
    (each group in the caller's order), side by side. One pack() pads every sequence's queries to the longest chunk:
    one 60-token chunk among 48 decode tokens would attend 49 x 60 queries for 108. Returns input_ids [1, N],
    position_ids [1, N], [(PackedBatch, its slice of the N tokens)] and the index of each sequence's last new token
    among the N, in the caller's order."""
    groups = [rows for rows in ([i for i, t in enumerate(token_ids) if len(t) == 1], [i for i, t in enumerate(token_ids) if len(t) > 1]) if rows]
    ids, positions, batches, last, start = [], [], [], [], 0
    for rows in groups:
        group_ids, group_positions, batch = pack([token_ids[i] for i in rows], [start_positions[i] for i in rows],
                                                 [block_tables[i] for i in rows], block_size, device)
        end = start + group_ids.shape[1]
        ids.append(group_ids)
        positions.append(group_positions)
        batches.append((batch, slice(start, end)))
        last.append(batch.last + start)
        start = end
    packed = [i for rows in groups for i in rows]  # the packed groups' sequence k is the caller's packed[k]
    back = torch.tensor(sorted(range(len(packed)), key=packed.__getitem__), device=device)  # the caller's i is packed row back[i]
    return torch.cat(ids, dim=1), torch.cat(positions, dim=1), batches, torch.cat(last)[back]


class DecodeBatch:
    """Given: the inputs of a decode step (one new token per sequence) kept on the device between steps, as vLLM
    V1's persistent batch. Each step compares the step's positions and block tables with the last step's, on the
    host, and writes only what changed: the new tokens (one upload), positions that did not just advance by one,
    table entries that differ (a new block, a copy of the last one); positions, slots and mask advance on the device.
    Another batch size or table width lays every row out again. No host read: what changed is known on the host."""

    def __init__(self, block_size, device):
        self.block_size, self.device = block_size, device
        self.positions, self.tables = [], []  # the last step's, on the host
        self.block_tables = None

    def upload(self, values):
        """A list of ints as a tensor on the device. On CUDA from pinned memory, without waiting: a plain copy from
        pageable memory would hold the host until the device's queue drains, and it could not schedule meanwhile."""
        if torch.device(self.device).type != "cuda":
            return torch.tensor(values, dtype=torch.long, device=self.device)
        return torch.tensor(values, dtype=torch.long).pin_memory().to(self.device, non_blocking=True)

    def update(self, token_ids, positions, block_tables):
        """input_ids [1, S], position_ids [1, S] and the PackedBatch of a decode step: sequence i feeds token_ids[i]
        at positions[i], its blocks are block_tables[i] (covering that position)."""
        width = max(map(len, block_tables))
        if len(block_tables) != len(self.tables) or width != self.block_tables.shape[1]:  # every row again
            self.block_tables = self.upload([table + [0] * (width - len(table)) for table in block_tables])
            self.position_ids = self.upload(positions)
            rows = torch.arange(len(positions), device=self.device)
            self.query_index, self.query_valid, self.last = rows[:, None], torch.ones_like(rows, dtype=torch.bool)[:, None], rows
        else:
            self.position_ids += 1
            moved = [(row, p) for row, (p, before) in enumerate(zip(positions, self.positions)) if p != before + 1]
            changed = [(row, column, block) for row, (table, before) in enumerate(zip(block_tables, self.tables)) if table != before
                       for column, block in enumerate(table) if column >= len(before) or block != before[column]]
            if moved:  # another sequence in this row
                row, position = self.upload(moved).unbind(1)
                self.position_ids.index_put_((row,), position)
            if changed:  # a new block, a copy of the last one, or another sequence's table
                row, column, block = self.upload(changed).unbind(1)
                self.block_tables.index_put_((row, column), block)
        self.positions, self.tables = list(positions), [list(table) for table in block_tables]
        bs, positions = self.block_size, self.position_ids
        slots = self.block_tables.gather(1, (positions // bs)[:, None])[:, 0] * bs + positions % bs
        mask = torch.arange(width * bs, device=self.device) <= positions[:, None]  # a row's columns past its context: masked
        batch = PackedBatch(slots, self.block_tables, self.query_index, self.query_valid, mask[:, None, None], self.last)
        return self.upload(token_ids)[None], positions[None], batch


def check_step(config, num_blocks, token_ids, start_positions, block_tables):
    """Given: a step's token ids, positions and block ids, checked on the host before any kernel indexes with them (a GPU
    would die of a device-side assert): InvalidIndex (a ValueError), one sentence naming the value and the limit."""
    n = config.n_positions
    for i, (tokens, start, table) in enumerate(zip(token_ids, start_positions, block_tables)):
        check_token_ids(tokens, config.vocab_size, f"sequence {i}'s new token")
        check_indices([start, start + len(tokens) - 1], n, f"sequence {i}'s (first, last) position",
                      f"the model has {n} positions; keep every sequence inside its context")
        check_indices(table, num_blocks, f"sequence {i}'s block", f"the pool has {num_blocks} blocks")


@torch.no_grad()
def forward(model, cache, token_ids, start_positions, block_tables):
    """Run the new tokens of several sequences in ONE forward (see pack() for the arguments). Returns
    logits [S, vocab] of each sequence's last new token: only those can give a token. A decode step (one
    token each) takes its inputs from the cache's persistent DecodeBatch; any other step packs its decode
    tokens and its chunks apart (pack_groups), so that a decode token is not padded to the longest chunk."""
    check_step(model.config, len(cache.keys[0]), token_ids, start_positions, block_tables)
    if all(len(tokens) == 1 for tokens in token_ids):
        input_ids, position_ids, batch = cache.decode_batch.update([t[0] for t in token_ids], start_positions, block_tables)
        groups, last = [(batch, slice(None))], batch.last
    else:
        input_ids, position_ids, groups, last = pack_groups(token_ids, start_positions, block_tables, cache.keys[0].shape[1], model.device)
    transformer = model.transformer
    x = transformer.wte(input_ids) + transformer.wpe(position_ids)
    for layer, block in enumerate(transformer.h):
        x = x + attention_forward(block.attn, block.ln_1(x), cache, layer, groups)
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(transformer.ln_f(x[0, last]))


def sample(logits, seqs):
    """Given (exercise 6 teaches it): the next token of each sequence of `seqs` from its row of logits
    [len(seqs), vocab], in ONE vectorised pass (workshop/serving/sampling.py): each row by its request's sampling
    parameters (greedy by default), with the sequence's own generator and its tokens so far as history,
    so a sequence's tokens depend on its seed and its logits only, never on its neighbours in the batch."""
    return sample_tokens(logits, [seq.request.sampling for seq in seqs], [seq.generator for seq in seqs],
                         [seq.token_ids for seq in seqs])


# ----------------------------------------------------------------------------------------------
# 5c: the engine

@dataclass
class Request:
    """What a client submits. arrival_step (scripted tests) or arrival_time (seconds, real traffic) as
    in exercise 4. n > 1 asks for n continuations of the prompt (parallel sampling), which share the
    prompt's blocks; `sampling` (exercise 6) says how tokens are chosen, greedy unless asked, and
    continuation i draws with a generator seeded sampling.seed + i."""
    prompt_ids: list
    max_new_tokens: int
    arrival_step: int = 0
    arrival_time: float = 0.0
    n: int = 1
    sampling: SamplingParams = GREEDY


def _seed(sampling, i):
    """Continuation i's seed: seed + i, or None (a fresh one each) when the request gave none."""
    return None if sampling.seed is None else sampling.seed + i


@dataclass(eq=False)  # two sequences are the same only if they are the same object
class Sequence:
    """One continuation inside the engine. Its tokens are prompt + output; the first num_computed of
    them have their keys and values in the cache, at the slots of block_table."""
    id: int  # index in EngineResult.sequences: requests in the order submitted, continuations in order
    request: "Request"
    index: int = 0  # which of the request's n continuations
    output_ids: list = field(default_factory=list)
    num_computed: int = 0
    block_table: "BlockTable" = None  # None while not running
    admitted_step: int = -1  # first admission
    finished_step: int = -1
    preemptions: int = 0  # times its blocks were taken back (it resumed by recomputing its tokens)
    prefix_hit_tokens: int = 0  # tokens it found in the prefix cache instead of computing them
    arrival_s: float = 0.0
    first_token_s: float = 0.0
    finish_s: float = 0.0
    forks: list = field(default_factory=list)  # continuations 1..n-1, forked when this one's prompt is computed
    generator: torch.Generator = None

    @property
    def token_ids(self):
        return self.request.prompt_ids + self.output_ids

    @property
    def ttft(self):
        return self.first_token_s - self.arrival_s

    @property
    def tpot(self):
        n = len(self.output_ids)
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else 0.0

    @property
    def latency(self):
        return self.finish_s - self.arrival_s


@dataclass
class EngineStats:
    max_batch_size: int
    num_blocks: int
    block_size: int
    steps: int = 0
    generated_tokens: int = 0
    elapsed_s: float = 0.0
    batch_sizes: list = field(default_factory=list)  # sequences in each step's forward
    scheduled_tokens: list = field(default_factory=list)  # tokens through the model at each step
    blocks_in_use: list = field(default_factory=list)  # blocks owned at each step
    tokens_stored: list = field(default_factory=list)  # slots of those blocks that hold a token
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    copies: int = 0  # copy-on-write block copies

    @property
    def throughput(self):
        return self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def computed_tokens(self):
        """Token positions the model computed: prompts (minus prefix hits), outputs but the last, recomputations."""
        return sum(self.scheduled_tokens)

    @property
    def peak_blocks(self):
        return max(self.blocks_in_use, default=0)

    @property
    def kv_utilization(self):
        """Tokens stored / slots allocated, over all steps."""
        slots = sum(self.blocks_in_use) * self.block_size
        return sum(self.tokens_stored) / slots if slots else 0.0


@dataclass
class EngineResult:
    sequences: list  # every continuation: requests in the order submitted, each one's n in order
    stats: "EngineStats"
    finish_order: list  # sequence ids in the order they finished

    @property
    def outputs(self):
        return [seq.output_ids for seq in self.sequences]


class Engine:
    def __init__(self, model, max_batch_size, num_blocks=None, block_size=16, max_num_batched_tokens=512,
                 enable_prefix_caching=False, eos_token_id=EOS_TOKEN_ID):
        """num_blocks: the KV pool's size (default: enough for max_batch_size full contexts, exercise 4's
        worst case). max_num_batched_tokens: the most tokens one step computes; longer prompts are
        prefilled in chunks over several steps."""
        context = model.config.n_positions
        num_blocks = num_blocks or max_batch_size * -(-context // block_size)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size is {max_batch_size}: the engine must run at least 1 sequence.")
        if max_num_batched_tokens < max_batch_size:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) is below max_batch_size ({max_batch_size}): "
                             f"every running sequence must be able to decode its token each step; raise it.")
        self.model, self.max_batch_size, self.eos_token_id = model, max_batch_size, eos_token_id
        self.max_num_batched_tokens, self.enable_prefix_caching = max_num_batched_tokens, enable_prefix_caching
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.cache = PagedKVCache(model.config, num_blocks, block_size, model.device, next(model.parameters()).dtype)
        self.sequences, self.pending, self.finished = [], [], []
        self.num_requests = 0
        self.waiting = deque()  # arrived, not running: first come first served; the preempted go back to the front
        self.running = []  # in the order they were (re)admitted: the newest last
        self.step_index = 0
        self.stats = EngineStats(max_batch_size, num_blocks, block_size)
        self.start = None

    def clock(self):
        return time.perf_counter() - self.start

    @refused_when_dead
    def add_request(self, request):
        """Submit a request (its n continuations); rejects one that can never run, before any work."""
        where = f"Request {self.num_requests}"
        try:
            # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
            check_request(request.prompt_ids, request.max_new_tokens, self.model.config.n_positions, self.model.config.vocab_size)
        except ValueError as e:
            raise type(e)(f"{where}: {e}") from None  # the same class: InvalidIndex stays an IndexError too
        positions = len(request.prompt_ids) + request.max_new_tokens - 1  # the last token is never cached
        blocks = -(-positions // self.block_size)
        if blocks > self.allocator.num_blocks:
            raise ValueError(f"{where}: its prompt plus max_new_tokens need {blocks} KV blocks of {self.block_size} slots, the "
                             f"pool has {self.allocator.num_blocks}: give the engine more blocks or ask for fewer tokens.")
        if request.n < 1 or request.n > self.max_batch_size:
            raise ValueError(f"{where}: n={request.n} continuations cannot run together with max_batch_size="
                             f"{self.max_batch_size}: ask for 1 to {self.max_batch_size}.")
        seqs = [Sequence(id=len(self.sequences) + i, request=request, index=i,
                         generator=make_generator(_seed(request.sampling, i))) for i in range(request.n)]
        seqs[0].forks = seqs[1:]
        self.sequences += seqs
        self.num_requests += 1
        self.pending.append(seqs[0])
        return seqs

    # -- scheduling ------------------------------------------------------------------------------

    def receive_arrivals(self):
        """Pending requests that have arrived join the waiting queue (exercise 4's rule)."""
        now = self.clock()
        for seq in [s for s in self.pending if s.request.arrival_step <= self.step_index and s.request.arrival_time <= now]:
            self.pending.remove(seq)
            seq.arrival_s = seq.request.arrival_time if seq.request.arrival_step == 0 else max(seq.request.arrival_time, now)
            self.waiting.append(seq)

    def schedule(self):
        """Decide this step's work: [(sequence, number of its tokens to compute)], within the token
        budget. Running sequences first, in admission order; when blocks run out, the newest running
        one is preempted. Then, if nobody was preempted, waiting ones are admitted while seats, budget
        and blocks last."""
        # TODO (exercise 5c): this step's work, [(sequence, number of its tokens to compute)], in the order scheduled.
        #   What must hold when it returns:
        #   - Arrivals are in: self.receive_arrivals() (given) moves the requests that have arrived to self.waiting.
        #   - Budget: at most self.max_num_batched_tokens tokens in all; a sequence computes as many of its uncomputed
        #     tokens as the budget leaves (a whole prompt, a chunk of it, one decode token, or a resumed sequence's
        #     recompute).
        #   - Priority: running sequences before waiting ones, oldest admission first, so decodes are never starved.
        #   - Blocks: a sequence is scheduled only if the blocks its append will take (BlockTable.blocks_needed) are
        #     free, and its slots are reserved at once (self.reserve, given) so the next decision sees what is left.
        #     When a running sequence's blocks are not free, running sequences are preempted (self.preempt), the one
        #     admitted last first, until they are; a step that preempts admits nobody.
        #   - Admission: first come first served (the head of self.waiting or nobody). Seats: the running sequences plus
        #     the continuations still to be forked from them (seq.forks) never exceed max_batch_size, so a request's n
        #     continuations hold n seats from its admission on. An admitted sequence runs from its prefix hits (5d,
        #     prefix_hits: its BlockTable starts with them, num_computed = the tokens they hold), has admitted_step set on
        #     its first admission, and is the newest in self.running.
        #   Traps: hits that are free cached blocks leave the free list when shared, so they cannot also pay for the
        #   newcomer's new blocks; NoFreeBlocks from reserve means a decision above was wrong, never "try again".
        raise NotImplementedError("Exercise 5: implement Engine.schedule() (running first within the token budget and free blocks, preempting the newest; then admissions within seats).")

    def reserve(self, seq, n):
        """Give seq's next n tokens their slots now, so that the next sequence scheduled sees what is left:
        new blocks on demand, a copy of a shared last block (5d), and with prefix caching, the blocks that
        these tokens fill are cached at once, so that a request admitted later in this step reuses them."""
        for src, dst in seq.block_table.append(n, self.allocator):
            self.cache.copy_block(src, dst)
            self.stats.copies += 1
        first, full = seq.num_computed // self.block_size, (seq.num_computed + n) // self.block_size
        if self.enable_prefix_caching and full > first:  # only when these tokens fill a block: not every decode step
            hashes = block_hashes(seq.token_ids[:full * self.block_size], self.block_size)
            for block, block_hash in zip(seq.block_table.blocks[first:full], hashes[first:]):
                self.allocator.cache(block, block_hash)

    def prefix_hits(self, seq):
        """5d: the cached blocks holding seq's first tokens, up to the first miss. The last token is never
        a hit: its logits must be computed to give the next token."""
        if not self.enable_prefix_caching:  # given: no hit without prefix caching, so that 5c's engine runs before 5d is done
            return []
        # TODO (exercise 5d): the cached blocks that already hold seq's first tokens, as a list of block ids, in order.
        #   - Only a run of leading full blocks counts: a block after a miss is no hit (its keys depend on the missing
        #     one), whatever the allocator remembers (self.allocator.cached_block looks a hash up).
        #   - The last token is never a hit: its logits give the next token, so it must be computed; a prompt that is
        #     entirely cached still computes its last block.
        #   - Nothing changes owner here: schedule() shares them on admission.
        raise NotImplementedError("Exercise 5: implement Engine.prefix_hits() (cached blocks of the sequence's first tokens, up to the first miss).")

    def preempt(self, seq):
        """Take every block of a running sequence back; it waits at the front of the queue and will
        recompute its tokens (prompt and output so far) when it runs again."""
        # TODO (exercise 5c): preemption by recompute. When it returns, the sequence owns no block (block_table None;
        #   blocks other sequences share stay theirs), has nothing in the cache (num_computed 0) but keeps its output so far,
        #   and is the FIRST in self.waiting: it resumes before anyone who never ran, recomputing prompt + output.
        #   seq.preemptions and self.stats.preemptions count it. The caller has already taken it out of self.running.
        raise NotImplementedError("Exercise 5: implement Engine.preempt() (free its blocks, back to the front of the waiting queue).")

    # -- one step ----------------------------------------------------------------------------------

    def run_model(self, scheduled):
        """Given: ONE forward over the next n tokens of each scheduled (sequence, n), returning the logits of each
        one's last token [len(scheduled), vocab]. Exercise 11's engine sends decode-only steps to CUDA graphs here."""
        return forward(self.model, self.cache, [seq.token_ids[seq.num_computed:seq.num_computed + n] for seq, n in scheduled],
                       [seq.num_computed for seq, _ in scheduled], [seq.block_table.blocks for seq, _ in scheduled])

    @dies_on_error  # given: a step that raised marks the engine failed, and every later call raises EngineFailed (workshop/engine_failure.py)
    def step(self):
        """One iteration: schedule, reserve the slots, ONE forward over every scheduled token, then a
        token for each sequence whose tokens are now all computed; the finished leave."""
        # TODO (exercise 5c): one iteration. What the caller observes:
        #   - Nothing scheduled: nothing happens, and it is not a step.
        #   - Otherwise ONE forward (given: self.run_model) over every scheduled sequence's next n tokens, after self.record_memory() (it
        #     reads the tables the scheduler reserved); then every scheduled sequence has n more tokens computed.
        #   - Every sequence whose tokens are now all computed gets exactly one new token (self.add_token), all of them
        #     from ONE call of the given sample() per step (a vectorised batch); a prompt chunk gets none.
        #   - (5d) n > 1: when a prompt with forks is computed, its other continuations start there: they share its blocks
        #     (fork), run from this step on (the end of self.running), and draw their first tokens from the same logits
        #     row in the same sample() call, each with its own generator. Then the sequence has no forks left.
        #   - When it returns, the finished are out of self.running and own no block.
        #   - stats: steps, batch_sizes (sequences in the forward), scheduled_tokens (tokens in it); add_token counts
        #     generated_tokens.
        raise NotImplementedError("Exercise 5: implement Engine.step() (one packed forward, then a token for every sequence fully computed).")

    def add_token(self, seq, token, now):
        seq.output_ids.append(token)
        self.stats.generated_tokens += 1
        if len(seq.output_ids) == 1:
            seq.first_token_s = now
        if token == self.eos_token_id or len(seq.output_ids) == seq.request.max_new_tokens:
            seq.finished_step, seq.finish_s = self.step_index, now
            self.finished.append(seq)

    def record_memory(self):
        """Blocks owned and the slots of them holding a token (a shared block counts once)."""
        filled = {}
        for seq in self.running:
            table = seq.block_table
            for i, block in enumerate(table.blocks):
                filled[block] = max(filled.get(block, 0), min(self.block_size, table.num_tokens - i * self.block_size))
        self.stats.blocks_in_use.append(self.allocator.num_blocks - self.allocator.num_free_blocks)
        self.stats.tokens_stored.append(sum(filled.values()))

    def wait_for_next_arrival(self):
        first = min(self.pending, key=lambda s: (s.request.arrival_step, s.request.arrival_time))
        self.step_index = max(self.step_index, first.request.arrival_step)
        time.sleep(max(0.0, first.request.arrival_time - self.clock()))

    @refused_when_dead
    def run(self, requests):
        """Serve `requests` (a list of Request) until every continuation has finished."""
        for request in requests:
            self.add_request(request)
        self.start = time.perf_counter()
        while self.pending or self.waiting or self.running:
            if not self.waiting and not self.running:
                self.wait_for_next_arrival()
            steps_before = self.stats.steps
            self.step()
            if self.stats.steps == steps_before and self.waiting:
                waiting = f"{len(self.waiting)} sequence{'s wait' if len(self.waiting) != 1 else ' waits'}"
                held = self.allocator.num_blocks - self.allocator.num_free_blocks
                if held and not self.running:
                    raise RuntimeError(f"step {self.step_index} ran nothing while {waiting}: no sequence is running, yet {held} of "
                                       f"the {self.allocator.num_blocks} blocks are still held. A finished or preempted sequence's "
                                       f"blocks go back to the pool: BlockTable.free frees each one, and BlockAllocator.free "
                                       f"returns a block nobody holds any more to the free list.")
                raise RuntimeError(f"step {self.step_index} ran nothing while {waiting}: Engine.schedule must admit the head of "
                                   f"the queue when seats, budget and blocks allow, and Engine.step must count each step it runs.")
            self.step_index += 1
        self.stats.elapsed_s = self.clock()
        return EngineResult(self.sequences, self.stats, [seq.id for seq in self.finished])


def generate(model, requests, max_batch_size, eos_token_id=EOS_TOKEN_ID, **engine_options):
    """Serve requests with continuous batching on a paged KV cache. engine_options: num_blocks,
    block_size, max_num_batched_tokens, enable_prefix_caching (see Engine). Returns an EngineResult."""
    return Engine(model, max_batch_size, eos_token_id=eos_token_id, **engine_options).run(requests)
