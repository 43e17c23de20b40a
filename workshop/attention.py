"""Given code for module 10 (attention kernels): a model of the GPU's slow memory that counts the bytes
a kernel moves, the standard (materialising) attention as the baseline, the byte formulas, and two probes
the checker runs a kernel under: LargestTensor (its working set: the largest tensor it creates) and
BlocksRead (which blocks of a paged KV pool it reads, and how often).

A GPU keeps the kernel's inputs and output in HBM (high-bandwidth memory: tens of GB, ~2-3 TB/s on
an A100/H100) and computes in SRAM (on-chip: ~200 KB per streaming multiprocessor, ~10x faster).
`HBM` plays the slow memory: a kernel reaches q, k, v and its output only through `load` and
`store`, which count the bytes; whatever the kernel holds in local variables between them plays
SRAM. Plain PyTorch on a CPU has no such split (every op reads and writes main memory), so here the
count is the lesson, not the clock.
"""

import torch
from torch.overrides import TorchFunctionMode


class HBM:
    """The slow memory of one attention call: q [B, H, Tq, d], k and v [B, H, Tk, d], the output "o"
    [B, H, Tq, d], and any scratch tensor a kernel allocates (the standard path's scores "s").
    Tiles are ranges of rows along the sequence axis (dim 2), every batch row and head at once (a GPU
    runs those side by side, one thread block each)."""

    def __init__(self, q, k, v, causal=True):
        if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected q [B, H, Tq, d] and "
                             f"k, v [B, H, Tk, d] with the same B, H and d.")
        if causal and q.shape[2] > k.shape[2]:
            raise ValueError(f"{q.shape[2]} queries but {k.shape[2]} keys: with a causal mask the queries are the LAST Tq of "
                             f"the Tk positions, so Tq <= Tk.")
        self.causal = causal
        self.tensors = {"q": q, "k": k, "v": v, "o": torch.zeros_like(q)}
        self.bytes_read = self.bytes_written = 0
        self.loads = self.stores = 0

    def shape(self, name):
        return tuple(self.tensors[name].shape)

    def allocate(self, name, shape):
        """A scratch tensor in HBM (allocating moves nothing; writing it does)."""
        self.tensors[name] = torch.empty(shape, dtype=self.tensors["q"].dtype, device=self.tensors["q"].device)

    def load(self, name, start, stop):
        """Rows start..stop-1 (dim 2) of `name`, copied to fast memory: counts their bytes."""
        tile = self.tensors[name][:, :, start:stop].clone()
        self.bytes_read += tile.numel() * tile.element_size()
        self.loads += 1
        return tile

    def store(self, name, start, tile):
        """Write `tile` at rows start.. (dim 2) of `name`: counts its bytes."""
        target = self.tensors[name]
        if tile.shape[:2] != target.shape[:2] or tile.shape[3:] != target.shape[3:] or start + tile.shape[2] > target.shape[2]:
            raise ValueError(f"store({name!r}, {start}, tile {tuple(tile.shape)}) does not fit {name!r} {tuple(target.shape)}.")
        target[:, :, start:start + tile.shape[2]] = tile
        self.bytes_written += tile.numel() * tile.element_size()
        self.stores += 1

    @property
    def output(self):
        return self.tensors["o"]

    @property
    def bytes_moved(self):
        return self.bytes_read + self.bytes_written


def lower_right_mask(q_len, kv_len, device="cpu"):
    """Exercise 2's causal mask: the q_len queries are the LAST q_len of kv_len positions (True: may attend)."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


def standard_attention(hbm):
    """Attention as three kernels with the T x T matrices in HBM between them (the FlashAttention paper's
    Algorithm 0): S = Q K^T / sqrt(d) written out; read back, masked and softmaxed into P, written out;
    read back with V into O."""
    B, H, Tq, d = hbm.shape("q")
    Tk = hbm.shape("k")[2]
    hbm.allocate("s", (B, H, Tq, Tk))
    q, k = hbm.load("q", 0, Tq), hbm.load("k", 0, Tk)
    hbm.store("s", 0, q @ k.transpose(-1, -2) * d ** -0.5)
    s = hbm.load("s", 0, Tq)
    if hbm.causal:
        s = s.masked_fill(~lower_right_mask(Tq, Tk, s.device), float("-inf"))
    hbm.store("s", 0, torch.softmax(s, dim=-1))  # P overwrites S: the same bytes as a separate P
    p, v = hbm.load("s", 0, Tq), hbm.load("v", 0, Tk)
    hbm.store("o", 0, p @ v)
    return hbm.output


def standard_attention_bytes(B, H, Tq, Tk, d, element_size=4):
    """Bytes that standard_attention moves: Q, K read; S written, read; P written, read; V read; O written.
    The paper's Theta(N d + N^2) for Tq = Tk = N."""
    return element_size * B * H * (2 * Tq * d + 2 * Tk * d + 4 * Tq * Tk)


def visible_keys(i_stop, Tq, Tk, causal):
    """How many keys the queries of rows ..i_stop-1 see: up to the last one's position, Tk - Tq + i_stop - 1."""
    return Tk - Tq + i_stop if causal else Tk


def flash_attention_bytes(B, H, Tq, Tk, d, block_q, block_k, causal=True, element_size=4):
    """Bytes that a FlashAttention forward moves with the query tiles in the outer loop (FlashAttention-2's
    order): each Q tile read once, its O tile written once, and for each Q tile the K and V tiles it
    needs, each read whole; with the causal mask the tiles past the last query's position are skipped.
    Without the skipping, Tk / block_k tiles per query tile: the paper's Theta(N^2 d^2 / M) with
    block sizes ~ M / d (M the SRAM's size)."""
    keys = 0
    for i_start in range(0, Tq, block_q):
        needed = visible_keys(min(i_start + block_q, Tq), Tq, Tk, causal)
        keys += min(Tk, -(-needed // block_k) * block_k)
    return element_size * B * H * d * (2 * Tq + 2 * keys)


def decode_bytes(H, length, d, element_size=4):
    """Bytes one decode query must move whatever the kernel: its q, every cached key and value, its output."""
    return element_size * H * d * (2 + 2 * length)


class LargestTensor(TorchFunctionMode):
    """While active, records the largest tensor that any torch operation creates (not a view of the given
    pools, which already exist): the working set a kernel would need in fast memory. Used to check that
    paged Flash-Decoding handles one chunk at a time rather than gathering the whole sequence."""

    def __init__(self, *pools):
        super().__init__()
        self.pool_storages = {p.untyped_storage().data_ptr() for p in pools}
        self.numel, self.op, self.shape = 0, None, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.numel() > self.numel and t.untyped_storage().data_ptr() not in self.pool_storages:
                self.numel, self.op, self.shape = t.numel(), getattr(func, "__name__", str(func)), tuple(t.shape)
        return out


# Functions whose output holds some elements of a tensor argument: run on element numbers in its place, they say
# which elements they read (indexing with a tensor or a list copies; with ints and slices it is a view).
_SELECTING = {torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select, torch.gather, torch.Tensor.gather,
              torch.take, torch.Tensor.take, torch.nn.functional.embedding, torch.embedding, torch.masked_select,
              torch.Tensor.masked_select}
_TO_PYTHON = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy}


class BlocksRead(TorchFunctionMode):
    """While active, records which elements of the given pools [num_blocks, ...] torch operations read, and how
    often: the KV blocks a paged kernel would load from memory. Taking a view (a slice, a row, a reshape of
    the pool) or asking for a shape reads nothing; a function that selects elements (indexing with a tensor
    or a list, index_select, gather, ...) reads those it selects; any other function that computes from a
    pool reads every element of the pool's view it is given. blocks(i): the blocks of pool i read at all;
    most_reads(i): the most times one element was read."""

    def __init__(self, *pools):
        super().__init__()
        self.pools = pools
        self.storages = [p.untyped_storage().data_ptr() for p in pools]
        with torch._C.DisableTorchFunction():  # not the kernel's work: no other TorchFunctionMode (LargestTensor) sees it
            # A number for every element of each pool's storage: a function run on these numbers in place of
            # the pool says which elements it reads.
            self.ids = [torch.arange(p.untyped_storage().nbytes() // p.element_size(), device=p.device) for p in pools]
            self.reads = [torch.zeros_like(ids) for ids in self.ids]

    def blocks(self, i):
        pool = self.pools[i]
        read = torch.nonzero(self.reads[i]).flatten() - pool.storage_offset()
        return sorted(set((read // pool.stride(0)).tolist()))

    def most_reads(self, i):
        return int(self.reads[i].max())

    def _pool(self, value):
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in self.storages:
            return self.storages.index(value.untyped_storage().data_ptr())
        return None

    def _swap(self, value, found):
        """value with every view of a pool replaced by the same view of its element numbers: (pool, numbers) in found."""
        i = self._pool(value)
        if i is not None:
            found.append((i, self.ids[i].as_strided(value.shape, value.stride(), value.storage_offset())))
            return found[-1][1]
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self._swap(v, found) for v in value)
        if isinstance(value, dict):
            return {k: self._swap(v, found) for k, v in value.items()}
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            found = []
            swapped = self._swap(args, found), self._swap(kwargs, found)
            if not found:
                return out
            outputs = [out] if isinstance(out, torch.Tensor) else \
                [t for t in out if isinstance(t, torch.Tensor)] if isinstance(out, (list, tuple)) else []
            if func not in _TO_PYTHON and all(self._pool(t) is not None for t in outputs):
                return out  # a view of the pool, a shape, a dtype: nothing read
            if func in _SELECTING and len(found) == 1:
                found = [(found[0][0], func(*swapped[0], **swapped[1]))]
            for i, ids in found:
                self.reads[i][ids.flatten().unique()] += 1
        return out
