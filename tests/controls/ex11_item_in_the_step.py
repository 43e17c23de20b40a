"""decode_step reads the longest context back to the host (.item()) to attend only to the blocks in use: faster
eagerly, and right, but a graph cannot read a value while capturing, and would keep the capture's width for ever."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11b_decode_step_is_capturable"

base = reference_with(EXERCISE)
step = base.decode_step


def decode_step(model, cache, inputs, size, width):
    used = int(inputs.context_lens[:size].max().item())  # the bug: a host read inside the step
    return step(model, cache, inputs, size, min(width, -(-used // inputs.block_size)))


base.decode_step = decode_step
globals().update(public_names(base))
