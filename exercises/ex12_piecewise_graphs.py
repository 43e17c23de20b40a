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

Your part (pytest exercises/test_ex12_piecewise_graphs.py -k 12a, 12b, 12c):
  12a StepInputs.fill, run_piece, piecewise_forward
  12b PiecewiseGraphs.capture, PiecewiseGraphs.run, Engine.__init__'s pieces, Engine.run_model
  12c compile_piece
Stuck? exercises/hints/ex12.md has hints for each TODO, from the idea to near-code: open one at a time.
"""

import torch

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
        # TODO (exercise 12a): the contract:
        #   - the six buffers made in __init__ stay the SAME tensors (same data_ptr, shape and dtype): a captured piece reads
        #     and writes the addresses it was captured with, for ever. Copy into them; never assign a new tensor.
        #   - rows i < n: input_ids[i] = input_ids[i] given, positions[i] = positions[i] given.
        #   - rows n .. size-1 are padding: token 0 at position 0 (ids and positions the embeddings can read). Rows past
        #     `size` are not read.
        #   - raises ValueError unless 1 <= n <= size <= max_tokens (the buffers' rows).
        raise NotImplementedError("Exercise 12: implement StepInputs.fill() in exercises/ex12_piecewise_graphs.py (12a): copy a "
                                  "step's tokens into the buffers in place, padding to `size` rows.")



@torch.no_grad()
def run_piece(model, inputs, index, size):
    """Piece `index` (0 .. n_layer) of a step over the first `size` rows of `inputs`: reads its rows of the
    buffers, writes its results into them. Every shape follows from size alone."""
    # TODO (exercise 12a): the contract:
    #   - piece 0: the embeddings of input_ids at positions (token + position), then block 0's ln_1 and c_attn; piece i
    #     in 1 .. n_layer-1: block i-1 after its attention (c_proj of inputs.attn added to the residual, then its MLP on
    #     ln_2, added), then block i's ln_1 and c_attn; piece n_layer: block n_layer-1 after its attention, then ln_f.
    #   - reads and writes only the first `size` rows of the six buffers, by their names (inputs may be the reference's
    #     StepInputs): the residual stream into inputs.hidden, a block's c_attn output into inputs.qkv, ln_f's into
    #     inputs.final (in place: the same tensors, as a graph needs).
    #   - capturable: every kernel and every shape follows from `size` and `index` alone, never from the values in the
    #     buffers. So no .item(), .tolist(), int(t) or `if tensor`, no boolean index, no slicing by a count read from a
    #     tensor (two steps of the same size with other tokens run the same kernels).
    #   - row by row: row r of the results depends on row r of the inputs only (so padding rows never touch real ones).
    raise NotImplementedError("Exercise 12: implement run_piece() in exercises/ex12_piecewise_graphs.py (12a): one piece of "
                              "the model between two attentions, over the first `size` rows of the buffers.")



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
    # TODO (exercise 12a): the contract:
    #   - returns exercise 5's logits [S, vocab] (each sequence's last new token), and the pool afterwards holds what
    #     exercise 5's forward leaves: every block the same.
    #   - packs the step's tokens as exercise 5 does (paged.pack_groups: the decode tokens, then the chunks), fills the
    #     buffers with them padded to `size` rows, then runs piece 0, and for each layer its attention (attend, given:
    #     on the n real tokens only) followed by the next piece; the LM head reads inputs.final at each sequence's last token.
    #   - calls piece(index) once for each index 0 .. n_layer, in order, and nothing else runs a piece; piece None runs
    #     run_piece eagerly at `size`.
    #   - padded tokens write nowhere: no key or value of a padding row reaches the pool (attention runs on the real
    #     tokens, never on `size` rows).
    raise NotImplementedError("Exercise 12: implement piecewise_forward() in exercises/ex12_piecewise_graphs.py (12a): "
                              "exercise 5's forward, split at attention into pieces over padded buffers.")



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
        # TODO (exercise 12b): the contract:
        #   - one graph per pair of a size in self.sizes and a piece index 0 .. self.num_pieces-1 (graphs.new_graph), each
        #     recording self.run_piece(self.model, self.inputs, index, size) inside graphs.capture(graph, pool); kept in
        #     self.graphs under the key (size, index).
        #   - warm up first: run each size's pieces at least once inside graphs.warmup(device) before capturing them
        #     (with compile, the first call compiles: a compilation is not something to record).
        #   - one memory pool for all: every capture after the first gets the first graph's graph.pool(); capture the largest
        #     size first, so that the pool is sized by it.
        #   - a capture runs a piece once: the pieces write only the buffers, never the KV pool, so the cache is untouched.
        raise NotImplementedError("Exercise 12: implement PiecewiseGraphs.capture() in exercises/ex12_piecewise_graphs.py "
                                  "(12b): warm up, then one graph per capture size and piece, sharing one memory pool.")


    def run(self, token_ids, start_positions, block_tables):
        """Logits [S, vocab] of one step (exercise 5's forward's arguments): with graphs, its tokens padded to a
        capture size and each piece replayed; without, the pieces run eagerly at the step's own token count."""
        # TODO (exercise 12b): the contract:
        #   - returns exercise 5's logits [S, vocab] for the step, through piecewise_forward.
        #   - with graphs: the step's T tokens padded to padded_size(T, self.sizes) (ex11.padded_size: its ValueError stands
        #     for a step past the largest size), and each piece is a replay of the graph (size, index): n_layer + 1 replays,
        #     in order, and no Python of a piece runs (no run_piece call).
        #   - without graphs (self.graphs empty): each piece runs self.run_piece eagerly at T rows, the step's own count
        #     (padding buys nothing without a graph).
        raise NotImplementedError("Exercise 12: implement PiecewiseGraphs.run() in exercises/ex12_piecewise_graphs.py (12b): "
                                  "pad to a capture size and replay the pieces' graphs (or run them eagerly).")



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
        # TODO (exercise 12b): the contract:
        #   - exercise 11's __init__ (above, given) makes self.graphs, the full decode graphs, when graphs are on.
        #   - self.pieces = a PiecewiseGraphs over this engine's cache (self.cache) when graphs are on (its graphs on too)
        #     or compile is True (without graphs unless they are on, compiled if compile); None otherwise.
        #   - its capture sizes cover the step: its largest is the token budget (self.max_num_batched_tokens), or
        #     max_capture_tokens when that is given and smaller.
        raise NotImplementedError("Exercise 12: implement Engine.__init__'s pieces in exercises/ex12_piecewise_graphs.py "
                                  "(12b): PiecewiseGraphs over the engine's cache, sized by the token budget.")

    def run_model(self, scheduled):
        """Logits [len(scheduled), vocab], as exercise 5's run_model; the step's mode appended to self.modes."""
        # TODO (exercise 12b): the contract:
        #   - the same logits as exercise 5's run_model (paged.Engine.run_model): same tokens, greedy and seeded sampling.
        #   - appends the step's mode to self.modes, one per step: "full" for a decode-only step (every scheduled
        #     sequence computes one token) when self.graphs is not None, run by exercise 11's run_model (super: one replay);
        #     else "piecewise" for a step of at most the largest capture size's tokens when the pieces have graphs, run by
        #     self.pieces.run; else "eager".
        #   - an eager step runs self.pieces.run when there are pieces (compiled, no graphs) and it fits their largest size;
        #     any other runs exercise 5's forward (paged.Engine.run_model).
        raise NotImplementedError("Exercise 12: implement Engine.run_model() in exercises/ex12_piecewise_graphs.py (12b): "
                                  "each step in its mode, full, piecewise or eager, recorded in self.modes.")


def generate(model, requests, max_batch_size, cuda_graphs=None, compile=False, **engine_options):
    """Exercise 5's generate on Engine (see there). Returns an EngineResult."""
    return Engine(model, max_batch_size, cuda_graphs=cuda_graphs, compile=compile, **engine_options).run(requests)


# ----------------------------------------------------------------------------------------------
# 12c: fusion


def compile_piece():
    """run_piece compiled by torch.compile's Inductor (same arguments, same results within float rounding): one
    compiled graph per kind of piece (the first, a middle one, the last) for every depth and token count, no graph
    break, no CUDA graphs of its own."""
    # TODO (exercise 12c): the contract:
    #   - returns a callable with run_piece's arguments and effect: the buffers it writes equal run_piece's within float
    #     rounding (the checker allows 1e-4 in float32).
    #   - compiled by torch.compile with the Inductor backend, mode "default" (not "reduce-overhead": its own CUDA graphs
    #     would be recorded inside ours), fullgraph=True (a graph break would leave Python between kernels).
    #   - one compiled graph per kind of piece (the first, a middle one, the last), whatever the depth, the token count and
    #     the buffers' height: the compiled function takes the blocks and the buffers' first `size` rows as arguments, with
    #     the count dynamic (a size of 1 may compile once more: torch specializes it unless told otherwise). A graph per
    #     layer or per capture size would take minutes on a GPT-2 of 12 layers, and hit torch's limit of 8 per function.
    #   - compiling is not capturing: the first call compiles, so it comes before any capture (PiecewiseGraphs.capture's
    #     warm-up).
    raise NotImplementedError("Exercise 12: implement compile_piece() in exercises/ex12_piecewise_graphs.py (12c): the pieces "
                              "compiled by Inductor, one graph per kind of piece for every depth and token count.")
