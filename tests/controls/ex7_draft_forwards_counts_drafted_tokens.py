"""stats.draft_forwards adds the tokens drafted each round instead of reading self.draft.forwards: the same
number for exercise 7's own DraftModel (one forward per token), wrong for any other draft (a draft that runs a
forward of its own to catch up, or one that runs none, as a scripted or n-gram draft)."""

from tests.control_support import public_names, reference_with_edit

EXERCISE = "ex7_speculative"
PART = "differential_decoder"  # the check that catches it

globals().update(public_names(reference_with_edit(EXERCISE, "SpeculativeDecoder.step", "self.stats.draft_forwards = self.draft.forwards",
                                                  "self.stats.draft_forwards += len(drafted)")))
