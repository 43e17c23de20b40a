"""Exercise 12 built another way: the ids and positions are two rows of ONE [2, max_tokens] buffer, filled by one
copy; a piece computes with the functional ops (F.layer_norm, F.linear) and writes its results with out= and
copy_; the step is packed with ONE pack() for all its sequences (decode tokens padded to the longest chunk, as
exercise 5 did before pack_groups), one write and one paged attention per layer; the graphs are captured piece by
piece (each piece at every size, the largest first); the engine asks its pieces before it looks at the step's
shape; compile_piece lets torch specialize a size of 1 (two graphs per piece)."""

import torch
import torch.nn.functional as F

import solutions.ex5_paged_kv_cache as paged
from tests.control_support import public_names, reference_with
from workshop import graphs

EXERCISE = "ex12_piecewise_graphs"
_copy = reference_with(EXERCISE)  # token_capture_sizes, MODES, attend (given) and generate come from here
ex11 = _copy.ex11


class StepInputs:
    def __init__(self, config, max_tokens, device, dtype=torch.float32):
        C = config.n_embd
        self.rows = torch.zeros(2, max_tokens, dtype=torch.long, device=device)
        self.input_ids, self.positions = self.rows.unbind(0)
        self.hidden, self.qkv, self.attn, self.final = (torch.zeros(max_tokens, width, dtype=dtype, device=device)
                                                        for width in (C, 3 * C, C, C))

    def fill(self, input_ids, positions, size):
        n = len(input_ids)
        if n < 1 or n > size or size > self.rows.shape[1]:
            raise ValueError(f"{n} tokens padded to {size} rows do not fit buffers of {self.rows.shape[1]}")
        self.rows[:, :size].copy_(F.pad(torch.stack([input_ids.to(self.rows.device), positions.to(self.rows.device)]), (0, size - n)))


def _layer_norm(ln, x):
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


@torch.no_grad()
def run_piece(model, inputs, index, size):
    t = model.transformer
    _piece(t.wte, t.wpe, t.ln_f, t.h[index - 1] if index else None, t.h[index] if index < len(t.h) else None,
           inputs.input_ids[:size], inputs.positions[:size], inputs.hidden[:size], inputs.qkv[:size], inputs.attn[:size], inputs.final[:size])


def _piece(wte, wpe, ln_f, before, after, input_ids, positions, hidden, qkv, attn, final):
    if before is None:
        torch.add(wte(input_ids), wpe(positions), out=hidden)
    else:
        hidden.add_(F.linear(attn, before.attn.c_proj.weight, before.attn.c_proj.bias))
        hidden.add_(before.mlp(_layer_norm(before.ln_2, hidden)))
    if after is None:
        final.copy_(_layer_norm(ln_f, hidden))
    else:
        qkv.copy_(F.linear(_layer_norm(after.ln_1, hidden), after.attn.c_attn.weight, after.attn.c_attn.bias))


@torch.no_grad()
def piecewise_forward(model, cache, inputs, token_ids, start_positions, block_tables, size, piece=None):
    paged.check_step(model.config, len(cache.keys[0]), token_ids, start_positions, block_tables)
    n = sum(len(t) for t in token_ids)
    input_ids, positions, batch = paged.pack(token_ids, start_positions, block_tables, cache.keys[0].shape[1], model.device)
    inputs.fill(input_ids[0], positions[0], size)
    run = piece or (lambda index: run_piece(model, inputs, index, size))
    run(0)
    C = inputs.attn.shape[1]
    for layer, block in enumerate(model.transformer.h):
        heads = block.attn.n_head
        q, k, v = (x.reshape(n, heads, C // heads) for x in inputs.qkv[:n].chunk(3, dim=1))
        cache.write(layer, k, v, batch.slots)
        inputs.attn[:n].copy_(paged.paged_attention(q, cache, layer, batch).reshape(n, C))
        run(layer + 1)
    return model.lm_head(inputs.final.index_select(0, batch.last))


class PiecewiseGraphs(_copy.PiecewiseGraphs):
    def __init__(self, model, cache, max_tokens, use_graphs=None, compile=False):
        super().__init__(model, cache, max_tokens, use_graphs=use_graphs, compile=compile)

    def capture(self):
        device, pool = self.model.device, None
        for size in sorted(self.sizes, reverse=True):
            with graphs.warmup(device):
                for index in range(self.num_pieces):
                    self.run_piece(self.model, self.inputs, index, size)
        for index in range(self.num_pieces):
            for size in sorted(self.sizes, reverse=True):
                graph = graphs.new_graph(device)
                with graphs.capture(graph, pool):
                    self.run_piece(self.model, self.inputs, index, size)
                self.graphs[size, index] = graph
                pool = pool if pool is not None else graph.pool()

    def run(self, token_ids, start_positions, block_tables):
        count = sum(len(t) for t in token_ids)
        if self.graphs:
            size = min(s for s in self.sizes if s >= count) if count <= max(self.sizes) else ex11.padded_size(count, self.sizes)
            replay = lambda index: self.graphs[size, index].replay()  # noqa: E731
        else:
            size = count
            replay = lambda index: self.run_piece(self.model, self.inputs, index, size)  # noqa: E731
        return piecewise_forward(self.model, self.cache, self.inputs, token_ids, start_positions, block_tables, size, replay)


class Engine(_copy.ex11.Engine):
    def __init__(self, model, max_batch_size, cuda_graphs=None, compile=False, max_capture_tokens=None, **options):
        super().__init__(model, max_batch_size, cuda_graphs=cuda_graphs, **options)
        self.modes = []
        budget = self.max_num_batched_tokens
        largest = budget if max_capture_tokens is None else min(budget, max_capture_tokens)
        graphs_on = self.graphs is not None
        self.pieces = PiecewiseGraphs(model, self.cache, largest, use_graphs=graphs_on, compile=compile) if graphs_on or compile else None

    def run_model(self, scheduled):
        count = sum(n for _, n in scheduled)
        fits = self.pieces is not None and count <= self.pieces.sizes[-1]
        decode_only = max(n for _, n in scheduled) == 1
        if decode_only and self.graphs is not None:
            self.modes.append("full")
            return ex11.Engine.run_model(self, scheduled)
        self.modes.append("piecewise" if fits and self.pieces.graphs else "eager")
        if not fits:
            return paged.Engine.run_model(self, scheduled)
        return self.pieces.run([s.token_ids[s.num_computed:s.num_computed + n] for s, n in scheduled],
                               [s.num_computed for s, _ in scheduled], [s.block_table.blocks for s, _ in scheduled])


def compile_piece():
    compiled = torch.compile(_piece, fullgraph=True, dynamic=True)  # a size of 1 gets a graph of its own

    def piece(model, inputs, index, size):
        t = model.transformer
        with torch.no_grad():
            compiled(t.wte, t.wpe, t.ln_f, t.h[index - 1] if index else None, t.h[index] if index < len(t.h) else None,
                     inputs.input_ids[:size], inputs.positions[:size], inputs.hidden[:size], inputs.qkv[:size], inputs.attn[:size], inputs.final[:size])
    return piece


_copy.StepInputs, _copy.run_piece, _copy.piecewise_forward = StepInputs, run_piece, piecewise_forward
_copy.PiecewiseGraphs, _copy.Engine, _copy.compile_piece = PiecewiseGraphs, Engine, compile_piece
globals().update({k: v for k, v in public_names(_copy).items() if k not in globals() or k in ("generate",)})
