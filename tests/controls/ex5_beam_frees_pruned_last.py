"""beam_step hands each extended beam's table to its first child and forks it for the others (no extra copy),
but frees the pruned beams only after the new beams have taken their blocks: the end state is right, yet
a step needs the pruned beams' blocks and the new ones at once, and runs out on a pool the reference fits."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5e_beam_search_runs_on_the_smallest_pool"  # the check that catches it


def beam_step(tables, parents, allocator):
    new, taken = [], set()
    for parent in parents:
        new.append(tables[parent] if parent not in taken else tables[parent].fork(allocator))
        taken.add(parent)
    copies = []
    for table in reversed(new):  # the forks write first: the first child keeps the block, unshared by then
        copies += table.append(1, allocator)
    for i, table in enumerate(tables):  # the bug: the pruned beams give their blocks back last
        if i not in taken:
            table.free(allocator)
    return new, copies


globals().update(public_names(reference_with(EXERCISE, beam_step=beam_step)))
