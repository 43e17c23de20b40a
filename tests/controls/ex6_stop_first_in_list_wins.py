"""StopChecker.add cuts the text at the first stop string of the LIST found in it, not at the earliest one in
the text: a token that completes two stop strings may leave part of the earlier one shown."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_6d_the_earliest_stop_string_wins"  # the check that catches it

module = reference_with(EXERCISE)


class StopChecker(module.StopChecker):
    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            self.text = self.tokenizer.decode([t for t in self.token_ids if t not in self.stop_token_ids])
            found = next((self.text.find(s) for s in self.stop if s in self.text), None)  # the bug: the list's order
            if found is not None:
                self.text, self.finish_reason = self.text[:found], "stop"
            elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finished else self._safe_length()
        piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return piece


module.StopChecker = StopChecker
globals().update(public_names(module))
