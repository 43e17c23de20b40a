"""padded_size that sorts the caller's list of sizes in place before scanning it (sizes need not be sorted, so it
sorts them): the right size comes back, but the caller's list has changed under it."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_differential_padded_size"  # the check that catches it


def padded_size(n, sizes):
    sizes.sort()  # the bug: the caller's list, in place
    for size in sizes:
        if n >= 1 and size >= n:
            return size
    raise ValueError(f"no capture size holds a batch of {n}")


globals().update(public_names(reference_with(EXERCISE, padded_size=padded_size)))
