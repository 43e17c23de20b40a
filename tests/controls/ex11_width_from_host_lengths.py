"""fill() keeps the step's context lengths as a Python list and decode_step reads only the blocks they need: no
host read of a tensor, right eagerly, but a graph captured while the buffers held padding (one key each) replays
a width of one block for every later step."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_one_graph_per_capture_size_replayed_each_step"

base = reference_with(EXERCISE)
step = base.decode_step


class StaticInputs(base.StaticInputs):
    def fill(self, token_ids, positions, block_tables, size):
        super().fill(token_ids, positions, block_tables, size)
        self.lengths = [p + 1 for p in positions] + [1] * (size - len(positions))


def decode_step(model, cache, inputs, size, width):
    lengths = getattr(inputs, "lengths", None)
    if lengths:  # the bug: a shape from the values of this call, frozen into a graph
        width = min(width, -(-max(lengths[:size]) // inputs.block_size))
    return step(model, cache, inputs, size, width)


base.StaticInputs, base.decode_step = StaticInputs, decode_step
globals().update(public_names(base))
