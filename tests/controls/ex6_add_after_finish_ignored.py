"""StopChecker.add after the request finished quietly records the token and returns nothing, instead of
raising: a caller that forgets to stop goes on generating without noticing."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6d_add_after_finishing_is_refused"  # the check that catches it

module = reference_with(EXERCISE)


class StopChecker(module.StopChecker):
    def add(self, token):
        if self.finished:  # the bug: no RuntimeError
            self.token_ids.append(token)
            return ""
        return super().add(token)


module.StopChecker = StopChecker
globals().update(public_names(module))
