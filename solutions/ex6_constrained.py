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
"""

import re

import interegular
import torch
from interegular.fsm import anything_else

from gpt import EOS_TOKEN_ID, check_request

# given code and references, never the student's earlier exercises:
from solutions.ex2_kv_cache import KVCache, forward
from workshop.serving.sampling import GREEDY, make_generator, sample

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
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
            raise TypeError(f"choices must be a list of strings, got {type(choices).__name__}: wrap a single answer in a list.")
        if not choices:
            raise ValueError("The list of choices is empty: give at least one string the output may be.")
        for i, choice in enumerate(choices):
            if not isinstance(choice, str) or not choice:
                raise ValueError(f"choice {i} is {choice!r}: every choice must be a non-empty string (an empty answer is "
                                 f"indistinguishable from no answer).")
        self.vocab = vocab
        self.choices = [c.encode("utf-8") for c in dict.fromkeys(choices)]  # duplicates dropped
        self.prefixes = {c[:i] for c in self.choices for i in range(len(c) + 1)}  # the choices' trie, node by node
        self.masks = {}  # state -> its mask, built once

    def start(self):
        return b""

    def allowed(self, state):
        """Bool mask [V]: True for every token after which the text is still a prefix of some choice, and
        for EOS when the text equals a choice. The tensor is cached: do not modify it."""
        if state not in self.masks:
            ids = set()
            for choice in self.choices:
                if choice.startswith(state):
                    rest = choice[len(state):]
                    for end in range(1, min(len(rest), self.vocab.longest) + 1):  # every token that spells a start of rest
                        token = self.vocab.index.get(rest[:end])
                        if token is not None:
                            ids.add(token)
            if state in self.choices:
                ids.add(self.vocab.eos_token_id)
            self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]

    def advance(self, state, token_id):
        """The state after token_id (not EOS: it ends the output)."""
        token = self.vocab.tokens[token_id]
        if token is None or state + token not in self.prefixes:
            raise ValueError(f"token {token_id} ({token!r}) is not allowed after {state!r}: pick tokens from allowed(state).")
        return state + token


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
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    eos, state = constraint.vocab.eos_token_id, constraint.start()
    generator = make_generator(sampling.seed)
    kv_cache = KVCache(model.config.n_layer)
    input_ids = torch.tensor([prompt_ids], device=model.device)
    position_ids = torch.arange(len(prompt_ids), device=model.device)[None]
    new_tokens = []
    while len(new_tokens) < max_new_tokens:
        allowed = constraint.allowed(state)
        if not allowed.any():
            raise RuntimeError(f"the constraint allows no token after {new_tokens}: its vocabulary cannot spell any way on.")
        if allowed[eos] and allowed.sum() == 1:  # nothing else may follow: the model has no choice to make
            new_tokens.append(eos)
            break
        logits = forward(model, input_ids, position_ids, kv_cache)[:, -1].float().cpu()  # [1, V]
        logits = logits.masked_fill(~allowed, -float("inf"))
        token = sample(logits, [sampling], [generator], [list(prompt_ids) + new_tokens])[0]
        new_tokens.append(token)
        if token == eos:
            break
        state = constraint.advance(state, token)
        input_ids, position_ids = torch.tensor([[token]], device=model.device), position_ids[:, -1:] + 1
    return new_tokens


# ----------------------------------------------------------------------------------------------
# 6f: a regular expression

class RegexConstraint:
    """The output fully matches `pattern`, followed by EOS. A state is (DFA state, pending bytes of an
    unfinished UTF-8 character); start() is (dfa.initial, b"")."""

    def __init__(self, pattern, vocab):
        self.vocab, self.pattern = vocab, pattern
        self.dfa = CharDFA(pattern)
        self.masks = {}  # state -> its mask: built once per state, whatever the path that reached it
        if self.dfa.initial is None or not self.allowed(self.start()).any():
            raise ValueError(f"no token of the vocabulary can start a match of the regex {pattern!r}: it matches nothing "
                             f"that these tokens can spell; check the regex.")

    def start(self):
        return (self.dfa.initial, b"")

    def _walk(self, state, data):
        """The state after the bytes `data`, or None if they leave every match."""
        dfa_state, pending = state
        split = utf8_split(pending + data)
        if split is None:
            return None
        text, unfinished = split
        for char in text:
            dfa_state = self.dfa.step(dfa_state, char)
            if dfa_state is None:
                return None
        if unfinished and not self.dfa.can_continue(dfa_state, unfinished):
            return None
        return (dfa_state, unfinished)

    def allowed(self, state):
        """Bool mask [V]: True for every token whose bytes keep the text on its way to a match, and for
        EOS in an accepting state with nothing pending. Cached per state: do not modify it."""
        if state not in self.masks:
            dfa_state, pending = state
            ids = []
            if pending:  # rare: the tokens must first finish a character; no precomputed text helps
                ids = [i for i, token in enumerate(self.vocab.tokens) if token is not None and self._walk(state, token) is not None]
            else:  # the common case: walk each token's precomputed text, stopping at the first dead character
                step, can_continue = self.dfa.step, self.dfa.can_continue
                for i, split in enumerate(self.vocab.texts):
                    if split is None:
                        continue
                    text, unfinished = split
                    s = dfa_state
                    for char in text:
                        s = step(s, char)
                        if s is None:
                            break
                    else:
                        if not unfinished or can_continue(s, unfinished):
                            ids.append(i)
            if not pending and dfa_state in self.dfa.accepting:
                ids.append(self.vocab.eos_token_id)
            self.masks[state] = self.vocab.mask(ids)
        return self.masks[state]

    def advance(self, state, token_id):
        """The state after token_id (not EOS: it ends the output)."""
        token = self.vocab.tokens[token_id]
        new_state = None if token is None else self._walk(state, token)
        if new_state is None:
            raise ValueError(f"token {token_id} ({token!r}) is not allowed in state {state}: pick tokens from allowed(state).")
        return new_state


