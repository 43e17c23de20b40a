"""run() replays the padded size's graph at the widest captured width whatever the step's tables: right logits (the
keys past each row's context are masked), but a short context pays for attending over the whole context, the cost
the width buckets exist to save."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex11_cuda_graphs"
PART = "test_11c_replays_the_narrowest_width_that_holds_the_widest_table"

globals().update(public_names(reference_with_edit(EXERCISE, "DecodeGraphs.run", "key = size, padded_size(widest, self.widths)",
                                                  "key = size, max(self.widths)")))
