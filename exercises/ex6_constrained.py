"""Exercise 6, constrained decoding: the output is one of a list of strings, or matches a regex, always.

The model still proposes logits over the whole vocabulary; an automaton says which tokens may come
next, and every other token's logit becomes -inf before the sampler sees it. Decoding itself (greedy,
or any sampler, here the engines' workshop.serving.sampling) is unchanged: only the set it picks from shrinks.

    state --allowed(state)--> bool mask [V] --mask the logits, pick a token t--> advance(state, t) --> ...

GPT-2's tokens are byte strings (byte-level BPE): " the", "ing", "\\xc3" (the first half of "é").
Both constraints therefore work on the BYTES of the text; the rules, stated once:

  choices (6e)  A token is allowed when the text so far followed by the token's bytes is still a
                prefix of some choice. That covers a choice spelled by many tokens, and every way of
                spelling it (" yes" as one token, or " y" + "es", ...). EOS is allowed exactly when
                the text equals a choice; when no longer choice extends it, EOS is the only token
                left. The output (ended by EOS) is always exactly one of the choices.
  regex (6f)    A character-level DFA (interegular) of the regex, with the states from which no match
                can be reached removed. A token is allowed when its characters, walked one by one
                through the DFA from the current state, never leave the live states. A token that
                ends inside a UTF-8 character (b"\\xc3") keeps those bytes pending: it is allowed when
                some character starting with the pending bytes has a live transition, and the next
                token must complete it. A token that cannot be UTF-8 at that point (a stray
                continuation byte) is never allowed. EOS is allowed exactly in accepting states with
                nothing pending. The output (ended by EOS) always satisfies re.fullmatch(regex, text).
                These are outlines-core's masks, which walks a byte-level DFA: the checker compares.
  cache         A mask depends only on the state, so each state's mask is built once (a Python loop
                over 50,257 token texts, milliseconds) and looked up afterwards (a dict lookup).

The parts, each graded on its own (pytest exercises/test_ex6_constrained.py -k 6e, -k 6f):
  6e  ChoiceConstraint (refuse bad choices, allowed, advance) and generate, the constrained loop
  6f  RegexConstraint (refuse a regex no token can start, allowed with a cache per state, advance)
Given: Vocabulary (every token's bytes, once), utf8_split, and CharDFA (interegular's automaton, its
dead states removed, with step() and can_continue() for the unfinished-character rule).
Stuck? exercises/hints/ex6_constrained.md has hints for each TODO, from the idea to near-code: open one at a time.
Check your work with:  pytest exercises/test_ex6_constrained.py   (-k 6e or -k 6f for one part)
"""

import re

import interegular
import torch
from interegular.fsm import anything_else

from gpt import EOS_TOKEN_ID, check_request

# given code and references, never the student's earlier exercises:
from solutions.ex2_kv_cache import KVCache, forward  # noqa: F401 (for your generate)
from workshop.serving.sampling import GREEDY, make_generator, sample  # noqa: F401 (for your generate)

# ----------------------------------------------------------------------------------------------
# Given: the vocabulary as bytes, UTF-8 pieces, and the regex's character-level DFA


def utf8_split(data):
    """Split bytes into (the text of their complete characters, the bytes of an unfinished last one).

    b"caf\\xc3" -> ("caf", b"\\xc3"); b"caf\\xc3\\xa9" -> ("café", b""); bytes that no further byte can
    make valid UTF-8 (b"\\xa9" alone, b"\\xff") -> None."""
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as error:
        if error.reason == "unexpected end of data":  # valid so far, cut inside the last character
            return data[:error.start].decode("utf-8"), data[error.start:]
        return None


def _gpt2_byte_decoder():
    """GPT-2's byte-level BPE writes each byte as a printable character ("Ġ" is the space): back to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


class Vocabulary:
    """Every token's bytes, computed once and shared by all constraints (building it takes ~0.1 s).

    tokens[i]   the bytes of token i; None for a special token (GPT-2's <|endoftext|>), which is no text
    texts[i]    utf8_split(tokens[i]): (text, unfinished bytes), or None (not UTF-8 at a text's start)
    index       bytes -> token id
    """

    def __init__(self, tokens, eos_token_id=EOS_TOKEN_ID):
        if not 0 <= eos_token_id < len(tokens) or tokens[eos_token_id] is not None:
            raise ValueError(f"eos_token_id {eos_token_id} must be a special token (None in tokens) of the vocabulary.")
        self.tokens, self.eos_token_id, self.size = list(tokens), eos_token_id, len(tokens)
        self.texts = [None if t is None else utf8_split(t) for t in self.tokens]
        self.index = {}
        for i, t in enumerate(self.tokens):
            if t is not None:
                self.index.setdefault(t, i)
        self.longest = max(len(t) for t in self.index)

    @classmethod
    def from_tokenizer(cls, tokenizer, eos_token_id=EOS_TOKEN_ID):
        decoder, special = _gpt2_byte_decoder(), set(tokenizer.all_special_ids)
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        return cls([None if i in special else bytes(decoder[c] for c in p) for i, p in enumerate(pieces)], eos_token_id)

    def decode(self, token_ids):
        """The text of generated tokens (special tokens, such as the final EOS, left out)."""
        return b"".join(self.tokens[t] for t in token_ids if self.tokens[t] is not None).decode("utf-8", errors="replace")

    def mask(self, ids):
        """A bool tensor [size], True at ids."""
        mask = torch.zeros(self.size, dtype=torch.bool)
        mask[list(ids)] = True
        return mask


class CharDFA:
    """A character-level DFA of a regular expression (Python syntax, fully matched), built with
    interegular, keeping only live states (those from which an accepting state can be reached).

    step(state, char) -> the next state, or None where no match can follow any more.
    accepting: the states where the text so far matches."""

    def __init__(self, pattern):
        if not isinstance(pattern, str):
            raise TypeError(f"the regex must be a string, got {type(pattern).__name__}.")
        try:
            re.compile(pattern)
            if any(look in pattern for look in ("(?=", "(?!", "(?<")):
                raise interegular.Unsupported("lookarounds are not supported")
            fsm = interegular.parse_pattern(pattern).to_fsm()
        except (re.error, interegular.Unsupported, interegular.InvalidSyntax, NotImplementedError) as error:
            raise ValueError(f"cannot build an automaton for the regex {pattern!r} ({type(error).__name__}: {error}): use a plain "
                             f"regular expression (no backreferences, lookarounds, anchors or \\b).") from None
        sources = {}  # state -> the states with a transition into it
        for state, transitions in fsm.map.items():
            for target in transitions.values():
                sources.setdefault(target, set()).add(state)
        live, todo = set(fsm.finals), list(fsm.finals)
        while todo:
            for state in sources.get(todo.pop(), ()):
                if state not in live:
                    live.add(state), todo.append(state)
        symbols = fsm.alphabet._symbol_mapping
        self.symbol = {char: symbol for char, symbol in symbols.items() if char is not anything_else}  # char -> its class
        self.other = symbols.get(anything_else)  # the class of every char not named in the regex
        self.transitions = {s: {symbol: t for symbol, t in fsm.map.get(s, {}).items() if t in live} for s in live}
        self.initial = fsm.initial if fsm.initial in live else None  # None: the regex matches nothing at all
        self.accepting = frozenset(fsm.finals & live)
        self._continues = {}

    def step(self, state, char):
        return self.transitions[state].get(self.symbol.get(char, self.other))

    def can_continue(self, state, unfinished):
        """Whether some character whose UTF-8 bytes start with `unfinished` (1 to 3 bytes, a valid start)
        has a live transition from `state`."""
        key = (state, unfinished)
        if key not in self._continues:
            first, last = _code_points_starting_with(unfinished)
            transitions = self.transitions[state]
            named = [c for c in self.symbol if first <= ord(c) <= last]
            possible = any(self.symbol[c] in transitions for c in named)
            if not possible and self.other in transitions:  # a char the regex never names, in that range?
                possible = len(named) < last - first + 1 - _surrogates_between(first, last)
            self._continues[key] = possible
        return self._continues[key]


def _code_points_starting_with(unfinished):
    """The code points whose UTF-8 encoding starts with the given valid, unfinished bytes: (first, last)."""
    lead = unfinished[0]
    length, value = (2, lead & 0x1F) if lead < 0xE0 else (3, lead & 0x0F) if lead < 0xF0 else (4, lead & 0x07)
    for byte in unfinished[1:]:
        value = value << 6 | byte & 0x3F
    free_bits = 6 * (length - len(unfinished))
    smallest, largest = {2: (0x80, 0x7FF), 3: (0x800, 0xFFFF), 4: (0x10000, 0x10FFFF)}[length]
    return max(value << free_bits, smallest), min((value + 1 << free_bits) - 1, largest)


def _surrogates_between(first, last):
    return max(0, min(last, 0xDFFF) - max(first, 0xD800) + 1)


# ----------------------------------------------------------------------------------------------
# 6e: one of a list of strings

class ChoiceConstraint:
    """The output is one of `choices` (strings), followed by EOS. A state is the bytes generated so far
    (always a prefix of some choice); start() is b""."""

    def __init__(self, choices, vocab):
        # TODO (exercise 6e): refuse bad choices, then prepare what allowed() and advance() need.
        #   - Before any work, one clear sentence each (ValueError, or TypeError for a wrong type): `choices`
        #     is not a list (or tuple) of strings (a bare string is a common slip: "yes" is not ["yes"]); the
        #     list is empty; a choice is the empty string (it would be indistinguishable from no answer at all).
        #   - Keep `vocab` as self.vocab (generate reads self.vocab.eos_token_id) and the choices as
        #     UTF-8 bytes: tokens are bytes, and a token may hold half of a character such as "é".
        #   - Masks depend only on the state: building each one once (a dict) makes later lookups free.
        raise NotImplementedError("Exercise 6: implement ChoiceConstraint.__init__ (part 6e) in exercises/ex6_constrained.py: "
                                  "refuse an empty list or an empty choice, keep the choices as bytes.")

    def start(self):
        return b""

    def allowed(self, state):
        """Bool mask [V]: True for every token after which the text is still a prefix of some choice, and
        for EOS when the text equals a choice. The tensor is cached: do not modify it."""
        # TODO (exercise 6e): the contract (a torch.bool tensor of shape [vocab.size]):
        #   - token t is allowed when state + vocab.tokens[t] is a prefix of some choice (bytes). So a
        #     choice spelled by several tokens is allowed one piece at a time, and EVERY way of spelling
        #     it counts (" yes" as one token, or " y" then "es"): the model picks its favourite.
        #   - EOS (vocab.eos_token_id, whose tokens entry is None: it is no text) is allowed exactly when
        #     state, as BYTES, is one of the choices (half a character pending is not a choice yet). When no
        #     longer choice extends it, EOS is the only True.
        #   - Cheap: the cost must grow with the choices' lengths, not with the vocabulary (no loop over
        #     50,257 tokens per state). vocab.index (bytes -> id) and vocab.mask(ids) are given.
        raise NotImplementedError("Exercise 6: implement ChoiceConstraint.allowed (part 6e) in exercises/ex6_constrained.py: "
                                  "every token that keeps the text a prefix of some choice, and EOS on a whole choice.")

    def advance(self, state, token_id):
        """The state after token_id (not EOS: it ends the output)."""
        # TODO (exercise 6e): the new state is the text so far followed by the token's bytes. A token
        # that allowed(state) forbids (or a special token) is a caller's bug: raise ValueError saying so.
        raise NotImplementedError("Exercise 6: implement ChoiceConstraint.advance (part 6e) in exercises/ex6_constrained.py: "
                                  "the text so far followed by the token's bytes.")


# ----------------------------------------------------------------------------------------------
# 6e: the constrained generation loop (used by both parts)

@torch.no_grad()
def generate(model, prompt_ids, constraint, max_new_tokens, sampling=GREEDY):
    """Decode one request under `constraint` (a ChoiceConstraint or RegexConstraint) with a KV cache
    (exercise 2's reference): greedy, or sampled by `sampling` (a workshop.serving.sampling.SamplingParams) with a
    generator seeded by sampling.seed. Returns the new token ids, the final EOS included.

    Each step masks the logits with constraint.allowed(state) (forbidden tokens get -inf), picks a token
    with the engines' sampler, workshop.serving.sampling.sample (history: the prompt and the tokens so far), and
    advances the state. When EOS is the only token allowed, it is appended without asking the model. If
    max_new_tokens runs out first, the output is a prefix of a valid answer (give enough tokens: a token
    has at least one byte)."""
    # given: a bad request, a prompt token outside the vocabulary included, is refused here on the host (a ValueError) before any kernel runs.
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    # TODO (exercise 6e): exercise 2's loop (prefill the prompt once, then one token per forward through
    # KVCache and forward, imported above), with the constraint in it:
    #   - start from constraint.start(); before each pick, the logits of every token that
    #     constraint.allowed(state) forbids become -inf, so no sampler can ever pick one; after a pick
    #     that is not EOS, state = constraint.advance(state, token).
    #   - pick with sample(logits [1, V], [sampling], [generator], [history]) (workshop.serving.sampling) and one
    #     generator, make_generator(sampling.seed), for the whole request: the same seed then gives the
    #     same output as the reference's (the checker compares, greedy and sampled). Trap: the history (for
    #     the repetition penalty) is the prompt AND the tokens so far, as in transformers and the engines.
    #   - stop after EOS (returned as the last token), or after max_new_tokens tokens. When the mask
    #     allows nothing but EOS, append it without running the model.
    #   - a mask that allows nothing at all means a broken constraint: raise, never pick from all -inf.
    raise NotImplementedError("Exercise 6: implement generate (part 6e) in exercises/ex6_constrained.py: the KV-cache loop "
                              "with the logits of forbidden tokens set to -inf before each pick.")


# ----------------------------------------------------------------------------------------------
# 6f: a regular expression

class RegexConstraint:
    """The output fully matches `pattern`, followed by EOS. A state is (DFA state, pending bytes of an
    unfinished UTF-8 character); start() is (dfa.initial, b"")."""

    def __init__(self, pattern, vocab):
        self.vocab, self.pattern = vocab, pattern
        self.dfa = CharDFA(pattern)  # refuses, in one sentence, a regex interegular cannot turn into a DFA
        # TODO (exercise 6f): prepare the mask cache (one mask per state, built on first use), then refuse
        # a regex that no token of the vocabulary can start (ValueError, one sentence): the DFA matches
        # nothing at all (self.dfa.initial is None), or the start state's mask allows no token (not even
        # EOS). Check it here, before any generation: it fails fast and says why.
        raise NotImplementedError("Exercise 6: implement RegexConstraint.__init__ (part 6f) in exercises/ex6_constrained.py: a "
                                  "cache for the masks, and a ValueError when no token can start a match.")

    def start(self):
        return (self.dfa.initial, b"")

    def allowed(self, state):
        """Bool mask [V]: True for every token whose bytes keep the text on its way to a match, and for
        EOS in an accepting state with nothing pending. Cached per state: do not modify it."""
        # TODO (exercise 6f): the contract (a torch.bool tensor of shape [vocab.size]), state = (dfa_state, pending):
        #   - token t is allowed when walking its characters through the DFA from dfa_state never dies
        #     (self.dfa.step returns None once no match can follow). Walk the WHOLE token: " 12a" starts
        #     well for [ 0-9]+ and still must be refused.
        #   - bytes: pending + the token's bytes, split by utf8_split into (text, unfinished). None: not
        #     UTF-8 (a stray continuation byte), refused. Unfinished bytes (b"\xc3", the first half of
        #     "é") are allowed when self.dfa.can_continue(the state after text, unfinished).
        #   - EOS is allowed exactly in an accepting state (self.dfa.accepting) with NOTHING pending: an
        #     accepting DFA state with half a character pending would end the output inside a character.
        #   - cache: the mask depends on the WHOLE state and on nothing else (not the step, not the path):
        #     a state seen before must cost a lookup, not another walk over 50,257 tokens. Building one must
        #     stay within a few times the reference's time (the checker measures it).
        raise NotImplementedError("Exercise 6: implement RegexConstraint.allowed (part 6f) in exercises/ex6_constrained.py: walk "
                                  "each token through the DFA, EOS only where it accepts, one cached mask per state.")

    def advance(self, state, token_id):
        """The state after token_id (not EOS: it ends the output)."""
        # TODO (exercise 6f): the same walk as allowed() for one token: (DFA state after its complete
        # characters, its unfinished bytes). A token that allowed(state) forbids: raise ValueError.
        raise NotImplementedError("Exercise 6: implement RegexConstraint.advance (part 6f) in exercises/ex6_constrained.py: walk "
                                  "the token's characters through the DFA, keep unfinished bytes pending.")
