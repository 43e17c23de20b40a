"""A request that finishes by max_new_tokens still holds back the tail that might have become a stop string
(or half a UTF-8 character), as if more tokens were coming: the streamed pieces fall short of the final text."""

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "pieces_add_up"  # the checker's part that catches it


class StopChecker(reference.StopChecker):
    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished.")
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        else:
            self.text = self.tokenizer.decode([t for t in self.token_ids if t not in self.stop_token_ids])
            found = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
            if found:
                self.text, self.finish_reason = self.text[:min(found)], "stop"
            elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finish_reason == "stop" else self._safe_length()  # the bug: "length" keeps its tail back
        piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return piece


globals().update(public_names(reference_with(EXERCISE, StopChecker=StopChecker)))
