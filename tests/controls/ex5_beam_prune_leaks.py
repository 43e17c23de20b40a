"""beam_step passes the chosen beams' blocks on to their children but never frees the pruned beams' tables
(the old beams no new beam extends): every step leaks their own blocks, and a long beam search drains the pool."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "5e"  # the check that catches it


def beam_step(tables, parents, allocator):
    new = [tables[parent].fork(allocator) for parent in parents]
    for parent in set(parents):  # the bug: only the extended beams let go; a pruned beam keeps its blocks for ever
        tables[parent].free(allocator)
    copies = []
    for table in new:
        copies += table.append(1, allocator)
    return new, copies


globals().update(public_names(reference_with(EXERCISE, beam_step=beam_step)))
