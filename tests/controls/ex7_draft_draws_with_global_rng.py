"""DraftModel.propose draws its sampled tokens with torch's global random state instead of the generator it is
given: the distribution is right, but a seeded request does not repeat."""

import torch

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "test_7a_sampled_draft_penalises_its_history"  # the check that catches it

module = reference_with(EXERCISE)


class DraftModel(module.DraftModel):
    def propose(self, context, k, sampling=module.GREEDY, generator=None):
        return super().propose(context, k, sampling, None)  # the bug: the generator is dropped (global random state)


module.DraftModel = DraftModel
globals().update(public_names(module))
