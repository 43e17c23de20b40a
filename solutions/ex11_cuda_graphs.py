"""Exercise 11: the step without the overhead: static shapes and CUDA graphs for decode.

A decode step of a small model does little arithmetic: GPT-2 124M reads its 0.25 GB of weights in about
60 us on an H200, yet exercise 5's step takes milliseconds there, because it is about 150 small kernels,
each launched from Python, and the GPU waits for the next launch. A CUDA graph records a step's kernels
once and replays them with one launch. The price is the graph's rules: it replays fixed shapes at fixed
addresses, with no Python in between. So the step's inputs must live in buffers allocated once, a batch
is padded up to one of a few sizes captured in advance, and nothing in the step may read a tensor's value
on the host or take a shape from it. vLLM, nano-vllm and SGLang capture their decode steps this way;
prefill, whose shapes vary with every prompt, stays eager.

The parts, each graded on its own:
  11a StaticInputs and padded_size: the decode step's inputs in buffers allocated once; each step's values
      copied in place, the batch padded up to a capture size, padded rows writing to a scratch slot
  11b decode_step: exercise 5's forward for one token per sequence, with shapes that depend only on the
      batch size and the block table's width, and no host reads
  11c DecodeGraphs: one graph per capture size and table width, warmed up and captured once, sharing one
      memory pool, the narrowest that holds the step replayed (on a CPU, workshop.graphs' stand-in keeps a
      graph's rules; eager without graphs)
  11d Engine: exercise 5's engine with its decode-only steps on 11c, prefill and mixed steps eager

Graphs are captured with workshop/graphs.py (given): new_graph, warmup, capture, and graph.replay().
"""

import torch
import torch.nn.functional as F

import solutions.ex5_paged_kv_cache as paged
from gpt import check_index
from workshop import graphs


def capture_sizes(max_batch_size):
    """Given: the batch sizes a graph is captured for: 1, 2, 4, 8, ... up to max_batch_size, which is always
    one of them (vLLM's list grows in steps of 8 past 8; powers of two keep the padding under half)."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return sizes + [max_batch_size]


def capture_widths(max_blocks):
    """Given: the block-table widths a graph is captured at, for each capture size: 1, 2, 4, ... blocks up to
    max_blocks, which is always one of them. decode_step attends to every key of its width (masked past each
    row's context), so a graph as wide as the whole context makes a short context pay for the longest. vLLM
    and SGLang capture one width, as their paged-attention kernels read only each row's context_lens keys;
    with SDPA over a gathered table the width is bucketed as the batch is: powers of two keep the padded blocks
    under half of those read, for log2(max_blocks) + 1 graphs per size."""
    return capture_sizes(max_blocks)


# ----------------------------------------------------------------------------------------------
# 11a: static inputs


def padded_size(n, sizes):
    """The smallest of `sizes` that holds n: a batch of n sequences, or a table of n blocks."""
    if n < 1:
        raise ValueError(f"padded_size of {n}: a decode step has at least one sequence, and a table at least one block.")
    fitting = [size for size in sizes if size >= n]
    if not fitting:
        raise ValueError(f"{n} sequences (or blocks of a table) are past the largest capture size {max(sizes)}: run that "
                         f"step eagerly, or capture a graph that large.")
    return min(fitting)


class StaticInputs:
    """A decode step's inputs, each in a buffer allocated once on `device` for max_batch_size rows and
    tables of max_blocks blocks. Rows past the batch are padding: they write their key and value into
    scratch_block, a block no sequence owns, and attend only to keys there."""

    def __init__(self, max_batch_size, max_blocks, block_size, scratch_block, device):
        self.block_size, self.scratch_block = block_size, scratch_block
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.long, device=device)
        self.input_ids = zeros(max_batch_size)  # the token each sequence feeds in
        self.positions = zeros(max_batch_size)  # its position
        self.slots = zeros(max_batch_size)  # the pool slot its key and value go to
        self.block_tables = zeros(max_batch_size, max_blocks)  # its blocks, padded with the scratch block
        self.context_lens = zeros(max_batch_size)  # the keys it attends to: its position + 1
        self.fill([], [], [], max_batch_size)  # every row padding until the first step

    def fill(self, token_ids, positions, block_tables, size):
        """Copy one step's values in place: sequence i feeds token_ids[i] at positions[i], its blocks are
        block_tables[i] (a list, covering that position); rows len(token_ids) .. size-1 become padding."""
        for i, (position, table) in enumerate(zip(positions, block_tables)):  # given: on the host (a negative one would wrap)
            check_index(position, len(table) * self.block_size, f"sequence {i}'s position", "its block table must cover it")
        pad, width = size - len(token_ids), self.block_tables.shape[1]
        scratch, bs = self.scratch_block, self.block_size
        slots = [table[p // bs] * bs + p % bs for p, table in zip(positions, block_tables)] + [scratch * bs] * pad
        tables = [table + [scratch] * (width - len(table)) for table in block_tables] + [[scratch] * width] * pad
        host = torch.tensor([list(token_ids) + [0] * pad, list(positions) + [0] * pad, slots,
                             [p + 1 for p in positions] + [1] * pad])  # one host tensor, one copy per buffer
        tables = torch.tensor(tables)
        if self.input_ids.is_cuda:  # from pinned memory a copy waits for no kernel: the host goes on while the device works
            host, tables = host.pin_memory(), tables.pin_memory()
        for buffer, values in zip((self.input_ids, self.positions, self.slots, self.context_lens), host):
            buffer[:size].copy_(values, non_blocking=True)
        self.block_tables[:size].copy_(tables, non_blocking=True)


# ----------------------------------------------------------------------------------------------
# 11b: a capturable step


@torch.no_grad()
def decode_step(model, cache, inputs, size, width):
    """One token through the model for each of the first `size` rows of `inputs`, over exercise 5's paged
    cache (its keys and values written first, at inputs.slots), attending to the first `width` blocks of
    each row's table. Returns logits [size, vocab]. Every shape depends on size and width only."""
    ids, positions, slots = inputs.input_ids[:size], inputs.positions[:size], inputs.slots[:size]
    tables = inputs.block_tables[:size, :width]
    keys_seen = width * cache.keys[0].shape[1]
    mask = torch.arange(keys_seen, device=ids.device) < inputs.context_lens[:size, None]  # [size, keys]: its own keys
    transformer = model.transformer
    x = transformer.wte(ids) + transformer.wpe(positions)  # [size, C]
    C = x.shape[-1]
    for layer, block in enumerate(transformer.h):
        attn = block.attn
        q, k, v = (t.view(size, attn.n_head, C // attn.n_head) for t in attn.c_attn(block.ln_1(x)).split(C, dim=1))
        cache.write(layer, k, v, slots)
        keys, values = (pool[tables].flatten(1, 2).transpose(1, 2) for pool in (cache.keys[layer], cache.values[layer]))
        y = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask[:, None, None])  # [size, H, 1, D]
        x = x + attn.c_proj(y.reshape(size, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(transformer.ln_f(x))


# ----------------------------------------------------------------------------------------------
# 11c: capture and replay


class DecodeGraphs:
    """Decode steps of up to max_batch_size sequences over `cache`, through one graph per capture size and
    table width (use_graphs, by default on CUDA) or eagerly. scratch_block: a block of the cache that no
    sequence owns. widths: the table widths captured for each size, each 1 .. max_blocks (by default
    capture_widths(max_blocks); [max_blocks] alone: one graph per size, every step at the full width)."""

    def __init__(self, model, cache, max_batch_size, max_blocks, scratch_block, use_graphs=None, widths=None):
        self.model, self.cache = model, cache
        self.sizes = capture_sizes(max_batch_size)
        self.max_blocks = max_blocks
        self.widths = sorted(set(capture_widths(max_blocks) if widths is None else widths))
        if not self.widths or not all(1 <= width <= max_blocks for width in self.widths):
            raise ValueError(f"table widths {widths}: give at least one, each from 1 to max_blocks = {max_blocks} blocks.")
        self.inputs = StaticInputs(max_batch_size, max_blocks, cache.keys[0].shape[1], scratch_block, model.device)
        self.graphs, self.outputs = {}, {}  # both keyed by (size, width)
        if model.device.type == "cuda" if use_graphs is None else use_graphs:
            self.capture()

    def capture(self):
        """One graph per (size, width), the largest first: the shared pool is sized by it and the others fit inside."""
        pool, pairs = None, [(size, width) for size in self.sizes for width in self.widths]
        for size, width in sorted(pairs, reverse=True):  # the largest size at the widest width first
            with graphs.warmup(self.model.device):
                for _ in range(2):
                    decode_step(self.model, self.cache, self.inputs, size, width)
            graph = graphs.new_graph(self.model.device)
            with graphs.capture(graph, pool):
                self.outputs[size, width] = decode_step(self.model, self.cache, self.inputs, size, width)
            self.graphs[size, width], pool = graph, pool or graph.pool()

    def run(self, token_ids, positions, block_tables):
        """Logits [n, vocab] of one decode step of n sequences (as StaticInputs.fill takes them). With graphs
        they are a view of the graph's output, overwritten by the next step: use them first."""
        # given: token ids, positions and block ids in range, on the host: a replay would read past a buffer and a GPU assert
        paged.check_step(self.model.config, len(self.cache.keys[0]), [[t] for t in token_ids], positions, block_tables)
        size = padded_size(len(token_ids), self.sizes)
        self.inputs.fill(token_ids, positions, block_tables, size)
        widest = max(len(table) for table in block_tables)
        if not self.graphs:  # eager: only the widest table's blocks, and no padded batch's worth of attention
            return decode_step(self.model, self.cache, self.inputs, size, widest)[:len(token_ids)]
        key = size, padded_size(widest, self.widths)  # the narrowest graph that holds every table of the step
        self.graphs[key].replay()
        return self.outputs[key][:len(token_ids)]


# ----------------------------------------------------------------------------------------------
# 11d: the engine on it


class Engine(paged.Engine):
    """Exercise 5's engine, its decode-only steps run by DecodeGraphs. cuda_graphs: None (default) uses them on
    CUDA only; True uses them anywhere (on a CPU, workshop.graphs' stand-in); False never. Its step is exercise 5's: a step
    that raised marks the engine failed, and every later call raises EngineFailed (workshop/engine_failure.py)."""

    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        super().__init__(model, max_batch_size, **options)
        self.graphs = None
        if cuda_graphs if cuda_graphs is not None else model.device.type == "cuda":
            scratch, dtype = self.allocator.num_blocks, self.cache.keys[0].dtype  # one block past the allocator's: nobody gets it
            self.cache = None  # exercise 5's pool goes before the one a block larger comes: never both at once
            self.cache = paged.PagedKVCache(model.config, scratch + 1, self.block_size, model.device, dtype)
            max_blocks = -(-model.config.n_positions // self.block_size)
            self.graphs = DecodeGraphs(model, self.cache, max_batch_size, max_blocks, scratch, use_graphs=True)

    def run_model(self, scheduled):
        """Logits [len(scheduled), vocab], as exercise 5's run_model (the scheduled sequences' last new tokens)."""
        if self.graphs is None or any(n != 1 for _, n in scheduled):
            return super().run_model(scheduled)  # prefill and mixed steps: shapes a graph cannot hold
        return self.graphs.run([seq.token_ids[seq.num_computed] for seq, _ in scheduled],
                               [seq.num_computed for seq, _ in scheduled], [seq.block_table.blocks for seq, _ in scheduled])


def generate(model, requests, max_batch_size, cuda_graphs=None, **engine_options):
    """Exercise 5's generate, decode steps through graphs (see Engine). Returns an EngineResult."""
    return Engine(model, max_batch_size, cuda_graphs=cuda_graphs, **engine_options).run(requests)
