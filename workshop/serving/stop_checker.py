"""Text for the server's streams: each choice's token ids through exercise 6's stop rules, token by token,
at a cost per token that grows with neither the output's length nor the number of stop strings (vLLM's
incremental detokenizer and stop checker). The engine client's output thread runs one per choice."""

from gpt import EOS_TOKEN_ID


class IncrementalStopChecker:
    """Exercise 6's StopChecker rules, token for token (stop token, stop strings across tokens, text held
    back while it may still become a stop string or ends in half a UTF-8 character), at a cost per token
    that grows with neither the output's length nor the number of stop strings: add() decodes only the
    last few tokens (vLLM's incremental detokenizer), a stop string is looked for only among the
    substrings that end in the new text (one set lookup per distinct stop length), and the text held back
    is found by looking the tail (at most the longest stop string) up in the set of every stop string's
    prefixes.

    vLLM's extensions: special_ids (the end-of-text token) make no text; a special id that is not a stop
    token (ignore_eos) is just counted; min_tokens: neither stop tokens nor stop strings end the request
    before it has that many tokens."""

    def __init__(self, tokenizer, stop=(), stop_token_ids=(EOS_TOKEN_ID,), max_new_tokens=None, min_tokens=0,
                 special_ids=(EOS_TOKEN_ID,)):
        stop = [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}: remove the empty ones.")
        self.tokenizer, self.stop, self.stop_token_ids = tokenizer, stop, set(stop_token_ids)
        self.special_ids = set(special_ids) | self.stop_token_ids
        self.max_new_tokens, self.min_tokens = max_new_tokens, min_tokens
        self.stop_set = set(stop)
        self.lengths = sorted({len(s) for s in stop})
        self.longest = self.lengths[-1] if stop else 0
        self.prefixes = {s[:i] for s in self.stop_set for i in range(1, len(s) + 1)}
        self.token_ids = []  # every new token, the stopping one included
        self.text_ids = []  # the tokens that make text: all but special ones
        self.text = ""  # the final text once finished; the text so far before that
        self.sent = 0  # characters of text already returned by add()
        self.finish_reason = None  # "stop" (stop token or stop string) or "length" (max_new_tokens)
        self.done = ""  # the text of text_ids[:read], which ends in a whole character: it never changes
        self.prefix = self.read = 0  # decoding restarts at text_ids[prefix], a token boundary a little before read

    @property
    def finished(self):
        return self.finish_reason is not None

    def add(self, token):
        if self.finished:
            raise RuntimeError("add() after the request finished: stop generating when .finished is True.")
        self.token_ids.append(token)
        count = len(self.token_ids)
        if token in self.stop_token_ids and count > self.min_tokens:
            self.finish_reason = "stop"
        else:
            if token not in self.special_ids:
                self.text_ids.append(token)
                searched = len(self.done)  # the text so far had no stop string: a new one ends after this
                self._decode()
                cut = self._find_stop(searched) if self.stop and count >= self.min_tokens else None
                if cut is not None:
                    self.text, self.finish_reason = self.text[:cut], "stop"
            if not self.finished and self.max_new_tokens is not None and count >= self.max_new_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finished else self._safe_length()
        piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return piece

    def _decode(self):
        """self.text = the decoded text (vLLM's incremental detokenizer: decode from a token boundary a
        little before the new tokens, keep what they added). Once it ends in a whole character, it is done."""
        start = len(self.tokenizer.decode(self.text_ids[self.prefix:self.read]))
        new = self.tokenizer.decode(self.text_ids[self.prefix:])[start:]
        if new and not new.endswith("\ufffd"):  # U+FFFD at the end: half a character, more bytes to come
            self.done += new
            self.prefix, self.read, new = self.read, len(self.text_ids), ""
        self.text = self.done + new  # a copy, not a decode

    def _find_stop(self, searched):
        """Where the earliest stop string that ends after text[:searched] starts, or None."""
        text, best = self.text, None
        for end in range(searched + 1, len(text) + 1):
            for length in self.lengths:
                start = end - length
                if start < 0:
                    break
                if (best is None or start < best) and text[start:end] in self.stop_set:
                    best = start
        return best

    def _safe_length(self):
        """Up to half a character at the end, and up to the earliest suffix that begins a stop string."""
        text = self.text
        end = len(text) - text.endswith("\ufffd")
        for start in range(max(0, end - self.longest + 1), end):
            if text[start:end] in self.prefixes:
                return start
        return end
