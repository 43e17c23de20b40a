"""Given code for module 10 (attention kernels): a model of the GPU's slow memory that counts the bytes
a kernel moves, the standard (materialising) attention as the baseline, and the byte formulas.

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
