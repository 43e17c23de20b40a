"""Paged Flash-Decoding that drops each chunk's query axis with squeeze() instead of squeeze(1): with one head
(or a head dim of 1) it drops that axis too, and the result is [d] instead of [1, d]. Right for tiny's 4 heads."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex10_attention"
PART = "test_10c_differential_paged"  # the check that catches it

globals().update(public_names(reference_with_edit(
    EXERCISE, "paged_flash_decoding", "outputs.append(out[:, 0])\n        lses.append(lse[:, 0])",
    "outputs.append(out.squeeze())\n        lses.append(lse.squeeze())")))
