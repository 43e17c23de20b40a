"""run() picks the graph's width from the first sequence's table instead of the widest: right while the first is the
longest, but a longer sequence later in the batch has its last blocks cut off (they lie past the graph's width)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_replays_the_narrowest_width_that_holds_the_widest_table"

globals().update(public_names(reference_with_edit(EXERCISE, "DecodeGraphs.run", "key = size, padded_size(widest, self.widths)",
                                                  "key = size, padded_size(len(block_tables[0]), self.widths)")))
