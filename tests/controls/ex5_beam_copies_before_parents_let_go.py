"""beam_step appends the new beams' slots while the old tables still hold their share, then frees them: every
child sees its parent's partly filled last block shared and copies it, an only child too (a width-1 search
copies a block every step where the reference copies none), and a step briefly holds a block more per child."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5e_beam_search_shares_copies_and_frees"  # the check that catches it


def beam_step(tables, parents, allocator):
    new = [tables[parent].fork(allocator) for parent in parents]
    copies = []
    for table in new:  # the bug: the parents still hold their share, so every partly filled last block looks shared
        copies += table.append(1, allocator)
    for table in tables:
        table.free(allocator)
    return new, copies


globals().update(public_names(reference_with(EXERCISE, beam_step=beam_step)))
