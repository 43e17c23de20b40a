"""Stop strings are looked for in each new token's own text only: a stop string spread over two tokens
is never found (and the streaming pieces are not held back)."""

import solutions.ex6_decoding as reference
from tests.control_support import public_names, reference_with

EXERCISE = "ex6_decoding"
PART = "6d"  # the checker's part that catches it


class StopChecker(reference.StopChecker):
    def add(self, token):
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
            return ""
        piece = self.tokenizer.decode([token])
        found = [i for i in (piece.find(s) for s in self.stop) if i >= 0]  # the bug: this token's text only
        if found:
            piece, self.finish_reason = piece[:min(found)], "stop"
        elif self.max_new_tokens is not None and len(self.token_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        self.text += piece
        return piece


globals().update(public_names(reference_with(EXERCISE, StopChecker=StopChecker)))
