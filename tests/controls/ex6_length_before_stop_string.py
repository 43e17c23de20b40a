"""StopChecker.add checks max_new_tokens before the stop strings: when the last allowed token completes a stop
string, the request finishes with "length" and its text keeps the stop string, instead of "stop" with the text
cut where the stop string starts."""

from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "test_differential_6d_stop_checker"  # the check that catches it


def add(self, token):
    if self.finished:
        raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
    self.token_ids.append(token)
    if token in self.stop_token_ids:
        self.finish_reason = "stop"
    else:
        self.text = self.tokenizer.decode([t for t in self.token_ids if t not in self.stop_token_ids])
        found = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:  # the bug: length first
            self.finish_reason = "length"
        elif found:
            self.text, self.finish_reason = self.text[:min(found)], "stop"
    safe = len(self.text) if self.finished else self._safe_length()
    piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
    return piece


_module = reference_with(EXERCISE)
_module.StopChecker.add = add
globals().update(public_names(_module))
