"""The paged KV cache built another way (the engine's scheduling is the reference's): pools laid out
[num_blocks, n_head, block_size, head_dim] as in vLLM's kernels, attention computed sequence by
sequence over each one's own pages (no padded grid of queries, a mask only where a chunk needs one),
an allocator that hands out never-cached free blocks before evicting cached ones (least recently
freed first among those), block tables that count their free slots, chained SHA-256 block hashes, and a
beam search step that hands a parent's table to its only child instead of forking and freeing it."""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"


class NoFreeBlocks(RuntimeError):
    """The pool has no free block left."""


class BlockAllocator:
    """Two free lists: blocks that cache nothing, handed out first (in the order freed), and freed
    blocks that still cache a prefix, evicted least recently freed first only when the first list is empty."""

    def __init__(self, num_blocks, block_size=16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: a pool needs at least one block of one slot.")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.empty = OrderedDict.fromkeys(range(num_blocks))  # free, caching nothing
        self.cached_free = OrderedDict()  # free, still caching tokens: least recently freed first
        self.hash_of_block, self.block_of_hash = {}, {}

    @property
    def num_free_blocks(self):
        return len(self.empty) + len(self.cached_free)

    def allocate(self):
        if self.empty:
            block, _ = self.empty.popitem(last=False)
        elif self.cached_free:
            block, _ = self.cached_free.popitem(last=False)  # evict: its tokens are about to be overwritten
            del self.block_of_hash[self.hash_of_block.pop(block)]
        else:
            raise NoFreeBlocks(f"no free KV block among {self.num_blocks}: finish or preempt a sequence before allocating.")
        self.ref_counts[block] = 1
        return block

    def share(self, block):
        if self.ref_counts[block] == 0:
            if block not in self.cached_free:
                raise ValueError(f"block {block} is free and caches nothing: allocate() it instead of sharing it.")
            del self.cached_free[block]
        self.ref_counts[block] += 1

    def free(self, block):
        if self.ref_counts[block] < 1:
            raise ValueError(f"block {block} has no owner left to free it (a double free).")
        self.ref_counts[block] -= 1
        if not self.ref_counts[block]:
            (self.cached_free if block in self.hash_of_block else self.empty)[block] = None

    def cached_block(self, block_hash):
        return self.block_of_hash.get(block_hash)

    def cache(self, block, block_hash):
        if block_hash in self.block_of_hash or block in self.hash_of_block:
            return
        self.block_of_hash[block_hash], self.hash_of_block[block] = block, block_hash
        if block in self.empty:  # a free block that now caches tokens moves to the evictable list
            del self.empty[block]
            self.cached_free[block] = None


class BlockTable:
    """Counts the slots left in its last block instead of recomputing blocks from lengths."""

    def __init__(self, block_size, blocks=()):
        self.block_size = block_size
        self.blocks = list(blocks)
        self.num_tokens = len(self.blocks) * block_size

    def _room(self):
        return len(self.blocks) * self.block_size - self.num_tokens  # free slots in the last block

    def _shared_partial_last(self, allocator):
        return self._room() > 0 and self.num_tokens > 0 and allocator.ref_counts[self.blocks[-1]] > 1

    def blocks_needed(self, num_new_tokens, allocator):
        if num_new_tokens <= 0:
            return 0
        overflow = max(0, num_new_tokens - self._room())
        return (overflow + self.block_size - 1) // self.block_size + int(self._shared_partial_last(allocator))

    def append(self, num_new_tokens, allocator):
        if num_new_tokens <= 0:
            return []
        copies = []
        if self._shared_partial_last(allocator):
            mine = allocator.allocate()
            copies.append((self.blocks[-1], mine))
            allocator.free(self.blocks[-1])
            self.blocks[-1] = mine
        left = num_new_tokens - self._room()
        while left > 0:
            self.blocks.append(allocator.allocate())
            left -= self.block_size
        self.num_tokens += num_new_tokens
        return copies

    def slot_mapping(self, start, end):
        positions = torch.arange(start, end)
        blocks = torch.tensor(self.blocks, dtype=torch.long)[positions // self.block_size]
        return (blocks * self.block_size + positions % self.block_size).tolist()

    def fork(self, allocator):
        child = BlockTable(self.block_size)
        child.blocks, child.num_tokens = list(self.blocks), self.num_tokens
        for block in child.blocks:
            allocator.share(block)
        return child

    def free(self, allocator):
        while self.blocks:
            allocator.free(self.blocks.pop())  # the tail first
        self.num_tokens = 0


def block_hashes(token_ids, block_size):
    """SHA-256 over the parent's digest and the block's tokens (vLLM's sha256 prefix-caching hash)."""
    digests, parent = [], b""
    for start in range(0, len(token_ids) // block_size * block_size, block_size):
        h = hashlib.sha256(parent)
        h.update(b",".join(str(t).encode() for t in token_ids[start:start + block_size]))
        parent = h.digest()
        digests.append(parent.hex())
    return digests


def beam_step(tables, parents, allocator):
    """A beam extended once passes its own table on (no fork, no free); a beam extended k > 1 times hands its
    table to the first child and forks it for the others; a pruned beam frees its table last."""
    children = {}
    for j, parent in enumerate(parents):
        children.setdefault(parent, []).append(j)
    new = [None] * len(parents)
    for parent, kids in children.items():
        for j in kids[1:]:
            new[j] = tables[parent].fork(allocator)
        new[kids[0]] = tables[parent]
    for i, table in enumerate(tables):
        if i not in children:
            table.free(allocator)
    copies = []
    for table in new:
        copies.extend(table.append(1, allocator))
    return new, copies


class PagedKVCache:
    """Per layer, keys and values [num_blocks, n_head, block_size, head_dim]: a block's head is contiguous."""

    def __init__(self, config, num_blocks, block_size, device, dtype=torch.float32):
        self.block_size = block_size
        shape = (num_blocks, config.n_head, block_size, config.n_embd // config.n_head)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]

    def write(self, layer, k, v, slots):
        """k, v [N, n_head, head_dim] into block slots // block_size, offset slots % block_size."""
        blocks, offsets = slots // self.block_size, slots % self.block_size
        self.keys[layer][blocks, :, offsets] = k
        self.values[layer][blocks, :, offsets] = v

    def copy_block(self, src, dst):
        for layer in range(len(self.keys)):
            self.keys[layer][dst].copy_(self.keys[layer][src])
            self.values[layer][dst].copy_(self.values[layer][src])


@dataclass
class PackedBatch:
    """Per sequence, where its queries are in the packed tokens and which pages hold its context."""
    slots: torch.Tensor  # [N] pool slot of each new token
    spans: list  # per sequence (first packed index, number of new tokens, context length after them)
    pages: list  # per sequence, a tensor of the physical blocks covering its context
    last: torch.Tensor  # [S] packed index of each sequence's last new token


def pack(token_ids, start_positions, block_tables, block_size, device):
    ids, positions, slots, spans, pages, last = [], [], [], [], [], []
    for tokens, start, blocks in zip(token_ids, start_positions, block_tables):
        end = start + len(tokens)
        spans.append((len(ids), len(tokens), end))
        pages.append(torch.tensor(blocks[:(end + block_size - 1) // block_size], dtype=torch.long, device=device))
        ids.extend(tokens)
        positions.extend(range(start, end))
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(start, end))
        last.append(len(ids) - 1)
    as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)
    return as_tensor(ids)[None], as_tensor(positions)[None], PackedBatch(as_tensor(slots), spans, pages, as_tensor(last))


def paged_attention(q, cache, layer, batch):
    """One SDPA per sequence over its own pages: q [N, n_head, head_dim] -> [N, n_head, head_dim]."""
    out = torch.empty_like(q)
    for (first, n, context), pages in zip(batch.spans, batch.pages):
        keys = cache.keys[layer][pages].transpose(0, 1).flatten(1, 2)[:, :context]  # [n_head, context, head_dim]
        values = cache.values[layer][pages].transpose(0, 1).flatten(1, 2)[:, :context]
        queries = q[first:first + n].transpose(0, 1)  # [n_head, n, head_dim]
        mask = None
        if n > 1:  # query i sits at position context - n + i: it sees keys up to there (bottom-right causal)
            mask = torch.arange(context, device=q.device) <= torch.arange(context - n, context, device=q.device)[:, None]
        out[first:first + n] = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask).transpose(0, 1)
    return out


def attention_forward(attn, x, cache, layer, batch):
    N, C = x.shape[1], x.shape[2]
    q, k, v = attn.c_attn(x[0]).view(N, 3, attn.n_head, C // attn.n_head).unbind(1)
    cache.write(layer, k, v, batch.slots)
    return attn.c_proj(paged_attention(q, cache, layer, batch).reshape(1, N, C))


@torch.no_grad()
def forward(model, cache, token_ids, start_positions, block_tables):
    input_ids, position_ids, batch = pack(token_ids, start_positions, block_tables, cache.block_size, model.device)
    t = model.transformer
    x = t.wte(input_ids) + t.wpe(position_ids)
    for layer, block in enumerate(t.h):
        x = x + attention_forward(block.attn, block.ln_1(x), cache, layer, batch)
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(t.ln_f(x[0, batch.last]))


globals().update(public_names(reference_with(
    EXERCISE, NoFreeBlocks=NoFreeBlocks, BlockAllocator=BlockAllocator, BlockTable=BlockTable, block_hashes=block_hashes, beam_step=beam_step,
    PagedKVCache=PagedKVCache, PackedBatch=PackedBatch, pack=pack, paged_attention=paged_attention,
    attention_forward=attention_forward, forward=forward)))
