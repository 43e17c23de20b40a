"""Exercise 11 built another way: the per-row inputs are views of ONE [4, max_batch_size] buffer, filled by one copy
(plus one for the tables); a padded row writes into the LAST slot of the scratch block and attends to that whole
block; attention is written out (scores, an additive -inf bias, softmax, weighted sum) instead of SDPA; the warm-up
runs once, at the largest size and width; the graphs are captured size by size, the widths inside (a dict per size
first); padded_size bisects a sorted list; the engine checks for a decode-only step before asking the graphs."""

import bisect

import torch

import solutions.ex5_paged_kv_cache as paged
from tests.control_support import public_names, reference_with
from workshop import graphs

EXERCISE = "ex11_cuda_graphs"
_copy = reference_with(EXERCISE)  # capture_sizes (given) and generate come from here


def padded_size(n, sizes):
    ordered = sorted(sizes)
    i = bisect.bisect_left(ordered, n)
    if n < 1 or i == len(ordered):
        raise ValueError(f"no capture size holds a batch of {n} (sizes {ordered})")
    return ordered[i]


class StaticInputs:
    def __init__(self, max_batch_size, max_blocks, block_size, scratch_block, device):
        self.block_size, self.scratch_block = block_size, scratch_block
        self.rows = torch.zeros(4, max_batch_size, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slots, self.context_lens = self.rows.unbind(0)  # views: one buffer
        self.block_tables = torch.zeros(max_batch_size, max_blocks, dtype=torch.long, device=device)
        self.fill([], [], [], max_batch_size)

    def fill(self, token_ids, positions, block_tables, size):
        bs, scratch, width = self.block_size, self.scratch_block, self.block_tables.shape[1]
        pad = size - len(token_ids)
        slots = [t[p // bs] * bs + p % bs for p, t in zip(positions, block_tables)]
        self.rows[:, :size].copy_(torch.tensor([
            list(token_ids) + [0] * pad,
            list(positions) + [0] * pad,
            slots + [scratch * bs + bs - 1] * pad,  # the scratch block's last slot
            [p + 1 for p in positions] + [bs] * pad,  # a padded row sees the whole scratch block
        ]))
        table = torch.full((size, width), scratch, dtype=torch.long)
        for i, blocks in enumerate(block_tables):
            table[i, :len(blocks)] = torch.tensor(blocks)
        self.block_tables[:size].copy_(table)


@torch.no_grad()
def decode_step(model, cache, inputs, size, width):
    bs = cache.keys[0].shape[1]
    ids, positions, slots = inputs.input_ids[:size], inputs.positions[:size], inputs.slots[:size]
    tables = inputs.block_tables[:size, :width]
    visible = torch.arange(width * bs, device=ids.device)[None] < inputs.context_lens[:size, None]
    bias = torch.zeros(visible.shape, dtype=cache.keys[0].dtype, device=ids.device).masked_fill(~visible, float("-inf"))
    h = model.transformer
    x = h.wte(ids) + h.wpe(positions)
    C = x.shape[-1]
    for layer, block in enumerate(h.h):
        attn = block.attn
        D = C // attn.n_head
        q, k, v = attn.c_attn(block.ln_1(x)).split(C, dim=1)
        cache.write(layer, k.view(size, attn.n_head, D), v.view(size, attn.n_head, D), slots)
        keys = cache.keys[layer][tables].reshape(size, width * bs, attn.n_head, D)
        values = cache.values[layer][tables].reshape(size, width * bs, attn.n_head, D)
        scores = torch.einsum("shd,sthd->sht", q.view(size, attn.n_head, D), keys) / D ** 0.5 + bias[:, None]
        y = torch.einsum("sht,sthd->shd", scores.softmax(dim=-1), values)
        x = x + attn.c_proj(y.reshape(size, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(h.ln_f(x))


class DecodeGraphs:
    def __init__(self, model, cache, max_batch_size, max_blocks, scratch_block, use_graphs=None, widths=None):
        self.model, self.cache, self.max_blocks = model, cache, max_blocks
        self.sizes = sorted(capture_sizes(max_batch_size))
        self.widths = sorted(set(capture_widths(max_blocks) if widths is None else widths))
        if not self.widths or not all(1 <= w <= max_blocks for w in self.widths):
            raise ValueError(f"table widths {widths}: each must be 1 .. {max_blocks}")
        self.inputs = StaticInputs(max_batch_size, max_blocks, cache.keys[0].shape[1], scratch_block, model.device)
        self.graphs, self.outputs = {}, {}
        if model.device.type == "cuda" if use_graphs is None else use_graphs:
            self.capture()

    def capture(self):
        device = self.model.device
        with graphs.warmup(device):  # once, at the largest size and width: what the first call sets up is shared
            for _ in range(3):
                decode_step(self.model, self.cache, self.inputs, self.sizes[-1], self.widths[-1])
        first = None
        for size in reversed(self.sizes):
            by_width = {}
            for width in reversed(self.widths):
                graph = graphs.new_graph(device)
                with graphs.capture(graph, None if first is None else first.pool()):
                    self.outputs[size, width] = decode_step(self.model, self.cache, self.inputs, size, width)
                by_width[width] = graph
                first = first or graph
            self.graphs.update({(size, width): graph for width, graph in by_width.items()})

    def run(self, token_ids, positions, block_tables):
        n = len(token_ids)
        size = padded_size(n, self.sizes)
        self.inputs.fill(token_ids, positions, block_tables, size)
        widest = max(map(len, block_tables))
        if not self.graphs:
            return decode_step(self.model, self.cache, self.inputs, size, widest)[:n]
        key = size, padded_size(widest, self.widths)
        self.graphs[key].replay()
        return self.outputs[key][:n]


class Engine(paged.Engine):
    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        super().__init__(model, max_batch_size, **options)
        self.graphs = None
        wanted = model.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if wanted:
            blocks = self.allocator.num_blocks
            dtype = self.cache.keys[0].dtype
            self.cache = paged.PagedKVCache(model.config, blocks + 1, self.block_size, model.device, dtype)
            per_sequence = (model.config.n_positions + self.block_size - 1) // self.block_size
            self.graphs = DecodeGraphs(model, self.cache, max_batch_size, per_sequence, blocks, use_graphs=True)

    def run_model(self, scheduled):
        decode_only = all(n == 1 for _, n in scheduled)
        if not (decode_only and self.graphs):
            return super().run_model(scheduled)
        seqs = [seq for seq, _ in scheduled]
        return self.graphs.run([s.token_ids[s.num_computed] for s in seqs], [s.num_computed for s in seqs],
                               [s.block_table.blocks for s in seqs])


capture_sizes, capture_widths = _copy.capture_sizes, _copy.capture_widths


def generate(model, requests, max_batch_size, cuda_graphs=None, **engine_options):
    return Engine(model, max_batch_size, cuda_graphs=cuda_graphs, **engine_options).run(requests)


Request = paged.Request
