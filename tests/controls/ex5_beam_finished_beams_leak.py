"""beam_step lets go of the old tables slot by slot, as many as there are new beams: while the search keeps its
width that is every old beam, but when beams finish and fewer new beams remain, the old beams past the new
width (pruned, or finished) keep their blocks for ever."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5e_beam_search_shares_copies_and_frees"  # the check that catches it


def beam_step(tables, parents, allocator):
    new = [tables[parent].fork(allocator) for parent in parents]
    for old, _ in zip(tables, new):  # the bug: new beam j replaces old beam j; old beams past the new width are forgotten
        old.free(allocator)
    copies = []
    for table in new:
        copies += table.append(1, allocator)
    return new, copies


globals().update(public_names(reference_with(EXERCISE, beam_step=beam_step)))
