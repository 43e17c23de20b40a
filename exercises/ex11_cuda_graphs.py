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

Your part (pytest exercises/test_ex11_cuda_graphs.py -k 11a, 11b, 11c, 11d):
  11a padded_size, StaticInputs.fill        11b decode_step
  11c DecodeGraphs.capture, DecodeGraphs.run  11d Engine.__init__'s graphs, Engine.run_model
Stuck? exercises/hints/ex11.md has hints for each TODO, from the idea to near-code: open one at a time.
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
    # TODO (exercise 11a): the contract:
    #   - returns the smallest size in `sizes` that is >= n (sizes need not be sorted); a larger one wastes a padded
    #     row's work on every layer, a smaller one drops sequences.
    #   - raises ValueError for n < 1, and for an n past the largest size (no graph holds it: the caller must know).
    raise NotImplementedError("Exercise 11: implement padded_size() in exercises/ex11_cuda_graphs.py (11a): the smallest "
                              "capture size that holds n sequences.")


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
        # TODO (exercise 11a): the contract:
        #   - the five buffers made in __init__ stay the SAME tensors (same data_ptr, shape and dtype): copy the new values
        #     into their first `size` rows in place; never assign a new tensor to self.<buffer>. A captured graph reads
        #     the addresses it was captured with, for ever: a new tensor is never seen by a replay.
        #   - row i < n: input_ids = token_ids[i], positions = positions[i], slots = the pool slot of that position
        #     through block_tables[i] (block * block_size + offset), block_tables row = block_tables[i] and then anything
        #     (columns past a row's context are never attended), context_lens = positions[i] + 1 (its keys, its own too).
        #   - rows n .. size-1 are padding: their slot is in self.scratch_block, and they attend to at least one key,
        #     all of it in that block (a row that attends to nothing is NaN; one that writes or reads a sequence's block
        #     corrupts or depends on it). Rows past `size` are not read.
        #   - few copies: a step calls fill once, so build each buffer's values on the host and copy once per buffer.
        raise NotImplementedError("Exercise 11: implement StaticInputs.fill() in exercises/ex11_cuda_graphs.py (11a): copy "
                                  "one step's values into the buffers, padding the batch to `size` rows.")


# ----------------------------------------------------------------------------------------------
# 11b: a capturable step


@torch.no_grad()
def decode_step(model, cache, inputs, size, width):
    """One token through the model for each of the first `size` rows of `inputs`, over exercise 5's paged
    cache (its keys and values written first, at inputs.slots), attending to the first `width` blocks of
    each row's table. Returns logits [size, vocab]. Every shape depends on size and width only."""
    # TODO (exercise 11b): the contract:
    #   - returns logits [size, vocab]; rows < n (the real ones) equal exercise 5's forward over the same step (one token
    #     per sequence at its position), and the pool afterwards holds what that forward leaves, but in the scratch block.
    #   - capturable: every kernel and every shape follows from `size` and `width` alone, never from the values in the
    #     buffers (two batches of the same size with other lengths, tables and real rows run the same kernels).
    #     So no .item(), .tolist(), int(t) or `if tensor`, no boolean index x[mask] (its shape is a count), no slicing by
    #     a length read from a tensor; slice the buffers by size and width (a view: same address), mask the rest.
    #   - the traps: write the new keys and values BEFORE attending (a token attends to itself); a padded row
    #     attends to its scratch key, never to nothing (a row whose mask is all False gives NaN); the key positions
    #     past each row's context_lens (of width * block_size) are masked, not cut off.
    raise NotImplementedError("Exercise 11: implement decode_step() in exercises/ex11_cuda_graphs.py (11b): one token per "
                              "row through the model over the paged cache, with shapes from size and width only.")


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
        # TODO (exercise 11c): the contract:
        #   - one graph per pair of a size in self.sizes and a width in self.widths (graphs.new_graph), each recording
        #     decode_step(self.model, self.cache, self.inputs, size, width) inside graphs.capture(graph, pool); keep each
        #     graph and the output tensor its capture returned in self.graphs and self.outputs, both under the key
        #     (size, width) (a replay writes the new logits into that very tensor).
        #   - warm up first: run the step at least once before the first capture, inside graphs.warmup(device), so
        #     that what a first call sets up lazily (workspaces, allocator blocks) is not recorded.
        #   - one memory pool for all: every capture after the first gets the first graph's graph.pool(). Only one
        #     graph replays at a time, so their intermediates may share memory; capture the largest pair first (the
        #     largest size at the widest width), so that the pool is sized by it and the smaller ones fit inside.
        #   - the trap: a capture runs the step once, and the step writes keys and values at inputs.slots: the buffers
        #     must hold padding only (every row in the scratch block), as __init__ leaves them.
        raise NotImplementedError("Exercise 11: implement DecodeGraphs.capture() in exercises/ex11_cuda_graphs.py (11c): "
                                  "warm up, then one graph per capture size and width, sharing one memory pool.")

    def run(self, token_ids, positions, block_tables):
        """Logits [n, vocab] of one decode step of n sequences (as StaticInputs.fill takes them). With graphs
        they are a view of the graph's output, overwritten by the next step: use them first."""
        # given: token ids, positions and block ids in range, on the host: a replay would read past a buffer and a GPU assert
        paged.check_step(self.model.config, len(self.cache.keys[0]), [[t] for t in token_ids], positions, block_tables)
        # TODO (exercise 11c): the contract:
        #   - returns logits [n, vocab] for the n sequences, equal to exercise 5's forward over the same step.
        #   - pads to padded_size(n, self.sizes) (its ValueError stands for a batch past the largest size) and fills
        #     self.inputs with the step's values: the only way a replay sees them.
        #   - with graphs: replays exactly one graph, that of the padded size at the narrowest width of self.widths
        #     that holds the step's widest table (padded_size of its number of blocks: that ValueError stands too), and
        #     runs no Python of the step (no decode_step call). A wider graph gives the same logits, attending to masked
        #     keys for nothing; a narrower one cuts the widest table's keys off.
        #   - without graphs (self.graphs empty): one eager decode_step at the padded size, reading only the widest
        #     table's blocks (a CPU pays for every key it reads; only a graph needs a width fixed in advance).
        #   - the trap: the graph's output tensor is rewritten by the next replay, and has `size` rows: return its
        #     first n.
        raise NotImplementedError("Exercise 11: implement DecodeGraphs.run() in exercises/ex11_cuda_graphs.py (11c): fill "
                                  "the static inputs, then replay the graph of the padded size and width (or run the step "
                                  "eagerly).")


# ----------------------------------------------------------------------------------------------
# 11d: the engine on it


class Engine(paged.Engine):
    """Exercise 5's engine, its decode-only steps run by DecodeGraphs. cuda_graphs: None (default) uses them on
    CUDA only; True uses them anywhere (on a CPU, workshop.graphs' stand-in); False never. Its step is exercise 5's: a step
    that raised marks the engine failed, and every later call raises EngineFailed (workshop/engine_failure.py)."""

    def __init__(self, model, max_batch_size, cuda_graphs=None, **options):
        super().__init__(model, max_batch_size, **options)
        self.graphs = None
        # TODO (exercise 11d): the contract:
        #   - cuda_graphs None: graphs exactly when the model is on CUDA; True: always (the CPU stand-in); False: never.
        #   - with graphs: self.graphs = a DecodeGraphs over this engine's cache for max_batch_size sequences and
        #     tables as long as the context (model.config.n_positions) needs, with a scratch block that NO sequence
        #     can ever be given: the allocator hands out blocks 0 .. num_blocks-1, so the cache needs one block more.
        #   - the allocator keeps its num_blocks: the engine admits and preempts exactly as exercise 5's does.
        raise NotImplementedError("Exercise 11: implement Engine.__init__'s graphs in exercises/ex11_cuda_graphs.py (11d): "
                                  "a cache with a scratch block, and DecodeGraphs over it.")

    def run_model(self, scheduled):
        """Logits [len(scheduled), vocab], as exercise 5's run_model (the scheduled sequences' last new tokens)."""
        # TODO (exercise 11d): the contract:
        #   - the same logits as exercise 5's run_model (super().run_model): same tokens, greedy and seeded sampling.
        #   - a decode-only step (every scheduled sequence computes exactly one token) goes through self.graphs: one
        #     replay; any step with a prompt or a chunk of one runs eagerly (super), as vLLM and nano-vllm do.
        #   - without graphs (self.graphs None), every step is exercise 5's.
        raise NotImplementedError("Exercise 11: implement Engine.run_model() in exercises/ex11_cuda_graphs.py (11d): decode-only "
                                  "steps through the graphs, the rest eagerly.")


def generate(model, requests, max_batch_size, cuda_graphs=None, **engine_options):
    """Exercise 5's generate, decode steps through graphs (see Engine). Returns an EngineResult."""
    return Engine(model, max_batch_size, cuda_graphs=cuda_graphs, **engine_options).run(requests)
