"""SpeculativeStats.acceptance_rate returns the int 0 before any draft, where the contract says 0.0: equal as
numbers, but not the float every other call returns (a caller that formats it, or checks its type, breaks)."""

from dataclasses import dataclass

from tests.control_support import public_names, reference_with

EXERCISE = "ex7_speculative"
PART = "differential_decoder"  # the check that catches it

_reference = reference_with(EXERCISE)


@dataclass
class SpeculativeStats(_reference.SpeculativeStats):
    @property
    def acceptance_rate(self):
        return self.accepted / self.drafted if self.drafted else 0  # the bug: 0, not 0.0


_reference.SpeculativeStats = SpeculativeStats
globals().update(public_names(_reference))
