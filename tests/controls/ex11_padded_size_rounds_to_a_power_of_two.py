"""padded_size rounds n up to the next power of two, whatever sizes were captured (6 for a batch of 5 becomes 8)."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex11_cuda_graphs"
PART = "test_11a_padded_size_is_the_smallest_capture_size_that_fits"


def padded_size(n, sizes):
    if n < 1 or n > max(sizes):
        raise ValueError(f"no size holds {n}")
    return 1 << (n - 1).bit_length()


globals().update(public_names(reference_with(EXERCISE, padded_size=padded_size)))
