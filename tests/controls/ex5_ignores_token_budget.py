"""schedule() gives every sequence all of its uncomputed tokens, whatever max_num_batched_tokens says:
no chunked prefill, so a long prompt runs whole in one step and stalls the requests decoding beside it."""

import solutions.ex5_paged_kv_cache as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex5_paged_kv_cache"


class Engine(reference.Engine):
    def schedule(self):
        limit, self.max_num_batched_tokens = self.max_num_batched_tokens, 1 << 62  # the bug: no budget
        try:
            return super().schedule()
        finally:
            self.max_num_batched_tokens = limit


globals().update(public_names(reference_with(EXERCISE, Engine=Engine)))
