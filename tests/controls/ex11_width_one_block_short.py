"""run() counts the widest context's blocks with a floor division, (position + 1) // block_size: a context that spills
into a new block gets one block less, so where that count sits just past a capture width (5 blocks: a graph of 4) the
block holding the newest token, its own key among them, is cut off."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_replays_the_narrowest_width_that_holds_the_widest_table"

globals().update(public_names(reference_with_edit(
    EXERCISE, "DecodeGraphs.run", "key = size, padded_size(widest, self.widths)",
    "key = size, padded_size(max(1, (max(positions) + 1) // self.inputs.block_size), self.widths)")))
