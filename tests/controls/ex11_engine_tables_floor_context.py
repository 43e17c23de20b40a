"""Engine whose graphs' tables hold n_positions // block_size blocks (rounded down): when the block size does not
divide the context, a sequence near the context's end has one block more than a table row holds."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11d_differential"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "Engine.__init__", "max_blocks = -(-model.config.n_positions // self.block_size)",
    "max_blocks = model.config.n_positions // self.block_size")))
