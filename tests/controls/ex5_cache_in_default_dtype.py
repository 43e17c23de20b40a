"""A PagedKVCache that allocates its pools in the default dtype (torch.zeros without dtype=, the dtype argument
ignored): right for a float32 model, but a float16 or bfloat16 model's keys and values do not fit its float32 pools
(twice the memory on a GPU, and write's index_copy_ refuses the mix)."""

import torch

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"
PART = "test_5b_differential_paged_forward"  # the check that catches it: the control runner runs only that


class PagedKVCache(reference.PagedKVCache):
    def __init__(self, config, num_blocks, block_size, device, dtype=torch.float32):
        super().__init__(config, num_blocks, block_size, device)  # the bug: the dtype is not passed on


globals().update(public_names(reference_with(EXERCISE, PagedKVCache=PagedKVCache)))
