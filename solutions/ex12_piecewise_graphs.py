"""Exercise 12: every step on graphs, with fewer kernels: piecewise CUDA graphs and fusion with torch.compile.

Module 11 replays decode-only steps. In a serving run most steps also carry a prompt, or a chunk of one, as
requests join while others finish, and those steps ran eagerly: a few hundred kernels launched from Python.
Their attention cannot be captured, as its shapes follow each sequence's chunk and context. Everything else
in the model works on one token at a time (the embeddings, the layer norms, the projections, the MLP, the
residual adds): for a step of T tokens its shapes are [T, C], whoever the tokens belong to. So vLLM splits the
forward at attention (its piecewise CUDA graphs): the pieces between two attentions are captured once per
token count, a step's tokens are padded up to the next count, and attention runs eagerly between the pieces,
on the real tokens only. Decode-only steps keep their full graph (module 11): vLLM V1's FULL_AND_PIECEWISE.

Even replayed, a piece is many small kernels, each a pass over memory (a layer norm, a GELU, an add).
torch.compile's Inductor fuses them into a few; its kernels are then captured like any others.

A GPT-2 of L layers has L + 1 pieces, each reading and writing the buffers of StepInputs:
    piece 0         the embeddings, then block 0's layer norm and qkv projection
    piece i (< L)   block i-1 after its attention (output projection, residual, MLP), then block i's qkv
    piece L         block L-1 after its attention, then the final layer norm
    attention i     between piece i and piece i + 1: exercise 5's paged attention over the real tokens

The parts, each graded on its own:
  12a the split forward: StepInputs.fill (a step's tokens copied into buffers allocated once, padded up),
      run_piece (one piece, its shapes from the token count only), piecewise_forward (pieces and attention in turn)
  12b capture and dispatch: PiecewiseGraphs (one graph per token count and piece, replayed in turn), and an
      Engine that runs each step in the mode the contract says: a full graph for decode-only steps, piecewise
      graphs for the others, eager past the largest capture size
  12c fusion: compile_piece, the pieces compiled by Inductor once for every depth and token count, captured after
      compiling

Graphs are captured with workshop/graphs.py (given): new_graph, warmup, capture, and graph.replay().
"""

import torch
import torch.fx.experimental._config as symbolic_shapes

import solutions.ex5_paged_kv_cache as paged
import solutions.ex11_cuda_graphs as ex11
from workshop import graphs

MODES = ("full", "piecewise", "eager")  # how a step ran: one decode graph, graphs of its pieces, or no graph
BUFFERS = ("input_ids", "positions", "hidden", "qkv", "attn", "final")  # StepInputs' buffers, in the order a piece takes them


def token_capture_sizes(max_tokens):
    """Given: the token counts the pieces are captured for, vLLM's: 1, 2, 4, then every 8 up to 256 and every 16
    past it, up to max_tokens, which is always the last (a step of T tokens pads to the smallest count >= T)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens is {max_tokens}: a step computes at least one token.")
    steps = [1, 2, 4, *range(8, 257, 8), *range(272, max_tokens + 1, 16)]
    return [size for size in steps if size < max_tokens] + [max_tokens]


# ----------------------------------------------------------------------------------------------
# 12a: the split forward


class StepInputs:
    """The buffers of a step of up to max_tokens tokens, allocated once on `device`: what the pieces read and write.
    Rows past a step's tokens are padding: the pieces compute them and nobody reads them."""

    def __init__(self, config, max_tokens, device, dtype=torch.float32):
        C = config.n_embd
        zeros = lambda *shape, dtype=dtype: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.input_ids = zeros(max_tokens, dtype=torch.long)  # each token's id
        self.positions = zeros(max_tokens, dtype=torch.long)  # and position
        self.hidden = zeros(max_tokens, C)  # the residual stream
        self.qkv = zeros(max_tokens, 3 * C)  # a block's queries, keys and values: what its attention reads
        self.attn = zeros(max_tokens, C)  # the attention's output: what the next piece reads
        self.final = zeros(max_tokens, C)  # the final layer norm's output: the LM head reads the last token of each sequence

    def fill(self, input_ids, positions, size):
        """Copy a step's n packed tokens (input_ids, positions: int tensors [n]) into the first n rows, in place;
        rows n .. size-1 become padding."""
        n = len(input_ids)
        if not 1 <= n <= size <= len(self.input_ids):
            raise ValueError(f"a step of {n} tokens padded to {size}: need 1 <= tokens <= size <= the buffers' "
                             f"{len(self.input_ids)} rows.")
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.input_ids[n:size].zero_()  # padding: token 0 at position 0, in range for the embeddings
        self.positions[n:size].zero_()


@torch.no_grad()
def run_piece(model, inputs, index, size):
    """Piece `index` (0 .. n_layer) of a step over the first `size` rows of `inputs`: reads its rows of the
    buffers, writes its results into them. Every shape follows from size alone."""
    _between_attentions(*_piece_arguments(model, inputs, index, size))


def _piece_arguments(model, inputs, index, size):
    """What piece `index` works with: the transformer, the block whose attention just ran (None: piece 0 starts from
    the embeddings), the block whose attention comes next (None: the last piece ends with ln_f), the buffers' rows."""
    blocks = model.transformer.h
    before = blocks[index - 1] if index > 0 else None
    after = blocks[index] if index < len(blocks) else None
    return (model.transformer, before, after, *(getattr(inputs, name)[:size] for name in BUFFERS))


def _between_attentions(transformer, before, after, input_ids, positions, hidden, qkv, attn, final):
    if before is None:
        x = transformer.wte(input_ids) + transformer.wpe(positions)
    else:
        x = hidden + before.attn.c_proj(attn)
        x = x + before.mlp(before.ln_2(x))
    hidden.copy_(x)  # in place: the buffers are what a graph reads and writes
    if after is not None:
        qkv.copy_(after.attn.c_attn(after.ln_1(x)))
    else:
        final.copy_(transformer.ln_f(x))


def attend(attn, cache, layer, inputs, n, groups):
    """Given: attention of layer `layer` for the n real tokens: their keys and values written at their slots, then
    exercise 5's paged attention of each group (pack_groups); the output into inputs.attn's first n rows."""
    C = inputs.attn.shape[1]
    q, k, v = (t.view(n, attn.n_head, C // attn.n_head) for t in inputs.qkv[:n].split(C, dim=1))
    y = []
    for batch, tokens in groups:
        cache.write(layer, k[tokens], v[tokens], batch.slots)
        y.append(paged.paged_attention(q[tokens], cache, layer, batch))
    inputs.attn[:n] = torch.cat(y).reshape(n, C)


@torch.no_grad()
def piecewise_forward(model, cache, inputs, token_ids, start_positions, block_tables, size, piece=None):
    """Exercise 5's forward (same arguments, same logits [S, vocab] and pool afterwards), split at attention: the
    step's tokens padded to `size` rows of `inputs`, the pieces run over them, attention between them over the real
    tokens. piece(index) runs piece `index` at `size` (default: run_piece, eagerly; PiecewiseGraphs replays a graph)."""
    paged.check_step(model.config, len(cache.keys[0]), token_ids, start_positions, block_tables)  # given: ids in range
    n = sum(map(len, token_ids))
    input_ids, positions, groups, last = paged.pack_groups(token_ids, start_positions, block_tables, cache.keys[0].shape[1],
                                                           model.device)
    inputs.fill(input_ids[0], positions[0], size)
    if piece is None:
        piece = lambda index: run_piece(model, inputs, index, size)  # noqa: E731
    piece(0)
    for layer, block in enumerate(model.transformer.h):
        attend(block.attn, cache, layer, inputs, n, groups)
        piece(layer + 1)
    return model.lm_head(inputs.final[last])


# ----------------------------------------------------------------------------------------------
# 12b: capture and dispatch


class PiecewiseGraphs:
    """Steps of up to max_tokens tokens over `cache`, their pieces replayed from one graph per capture size and
    piece (use_graphs, by default on CUDA), or run eagerly at the step's own token count. compile: the pieces
    compiled first (12c: compile_piece), then captured."""

    def __init__(self, model, cache, max_tokens, use_graphs=None, compile=False):
        self.model, self.cache = model, cache
        self.sizes = token_capture_sizes(max_tokens)
        self.num_pieces = model.config.n_layer + 1
        self.inputs = StepInputs(model.config, max_tokens, model.device, next(model.parameters()).dtype)
        self.graphs = {}  # (size, piece index) -> its graph
        use_graphs = model.device.type == "cuda" if use_graphs is None else use_graphs
        if compile and use_graphs and model.device.type != "cuda":
            raise ValueError("compiled pieces are captured on CUDA only: the CPU stand-in (workshop/graphs.py) replays the ATen "
                             "operations it recorded, and Inductor's fused kernels are C++ functions it never sees. On a "
                             "CPU, compile without graphs (use_graphs=False).")
        self.run_piece = compile_piece() if compile else run_piece
        if use_graphs:
            self.capture()

    def capture(self):
        """One graph per (size, piece), the largest size first: the shared pool is sized by it."""
        device, pool = self.model.device, None
        for size in reversed(self.sizes):
            with graphs.warmup(device):
                for index in range(self.num_pieces):
                    self.run_piece(self.model, self.inputs, index, size)
            for index in range(self.num_pieces):
                graph = graphs.new_graph(device)
                with graphs.capture(graph, pool):
                    self.run_piece(self.model, self.inputs, index, size)
                self.graphs[size, index], pool = graph, pool or graph.pool()

    def run(self, token_ids, start_positions, block_tables):
        """Logits [S, vocab] of one step (exercise 5's forward's arguments): with graphs, its tokens padded to a
        capture size and each piece replayed; without, the pieces run eagerly at the step's own token count."""
        tokens = sum(map(len, token_ids))
        if not self.graphs:
            piece = lambda index: self.run_piece(self.model, self.inputs, index, tokens)  # noqa: E731
            return piecewise_forward(self.model, self.cache, self.inputs, token_ids, start_positions, block_tables, tokens, piece)
        size = ex11.padded_size(tokens, self.sizes)  # its ValueError: no graph holds the step
        piece = lambda index: self.graphs[size, index].replay()  # noqa: E731
        return piecewise_forward(self.model, self.cache, self.inputs, token_ids, start_positions, block_tables, size, piece)


class Engine(ex11.Engine):
    """Exercise 11's engine (its decode-only steps on full graphs), its other steps on PiecewiseGraphs: each step
    runs in one mode, recorded in self.modes: "full" (a decode-only step with graphs), "piecewise" (any other step of
    up to the largest capture size, with graphs), "eager" (no graph). cuda_graphs as exercise 11's (None: on CUDA
    only). compile: the pieces compiled (12c). max_capture_tokens: the largest token count captured (default: the
    step's token budget, max_num_batched_tokens)."""

    def __init__(self, model, max_batch_size, cuda_graphs=None, compile=False, max_capture_tokens=None, **options):
        super().__init__(model, max_batch_size, cuda_graphs=cuda_graphs, **options)
        self.modes = []  # each step's mode, in order
        self.pieces = None
        if self.graphs is not None or compile:
            tokens = min(self.max_num_batched_tokens, max_capture_tokens or self.max_num_batched_tokens)
            self.pieces = PiecewiseGraphs(model, self.cache, tokens, use_graphs=self.graphs is not None, compile=compile)

    def run_model(self, scheduled):
        """Logits [len(scheduled), vocab], as exercise 5's run_model; the step's mode appended to self.modes."""
        tokens = sum(n for _, n in scheduled)
        if self.graphs is not None and all(n == 1 for _, n in scheduled):
            self.modes.append("full")
            return super().run_model(scheduled)  # exercise 11: one replay of the decode graph of its batch size
        if self.pieces is None or tokens > self.pieces.sizes[-1]:
            self.modes.append("eager")
            return paged.Engine.run_model(self, scheduled)  # exercise 5's forward
        self.modes.append("piecewise" if self.pieces.graphs else "eager")
        return self.pieces.run([seq.token_ids[seq.num_computed:seq.num_computed + n] for seq, n in scheduled],
                               [seq.num_computed for seq, _ in scheduled], [seq.block_table.blocks for seq, _ in scheduled])


def generate(model, requests, max_batch_size, cuda_graphs=None, compile=False, **engine_options):
    """Exercise 5's generate on Engine (see there). Returns an EngineResult."""
    return Engine(model, max_batch_size, cuda_graphs=cuda_graphs, compile=compile, **engine_options).run(requests)


# ----------------------------------------------------------------------------------------------
# 12c: fusion


def compile_piece():
    """run_piece compiled by torch.compile's Inductor (same arguments, same results within float rounding): one
    compiled graph per kind of piece (the first, a middle one, the last) for every depth and token count, no graph
    break, no CUDA graphs of its own."""
    compiled = torch.compile(_between_attentions, backend="inductor", mode="default", fullgraph=True, dynamic=True)

    @torch.no_grad()
    def piece(model, inputs, index, size):
        with symbolic_shapes.patch(backed_size_oblivious=True):  # a size of 1 is a size like any other: no graph of its own
            compiled(*_piece_arguments(model, inputs, index, size))  # the blocks are arguments: every middle piece is one graph
    return piece
