"""A different CORRECT design for exercise 6's constrained decoding, which its checker must accept:

- RegexConstraint walks a byte trie of the whole vocabulary (tokens sharing a start are walked once,
  and a dead branch prunes every token below it) through a byte-level view of the DFA built lazily
  from the character-level one, as outlines-core does; states are a small frozen dataclass; the masks
  are cached per state as lists of token ids and turned into tensors on the way out.
- ChoiceConstraint is a RegexConstraint of the escaped choices joined by "|" (same masks: a token is
  allowed when the text stays a prefix of some choice, EOS when it is one).
- generate reads the mask before the model (EOS alone is appended from its list of allowed ids), and masks
  with torch.where instead of masked_fill.

    pytest exercises/test_ex6_constrained.py --impl solutions --replace ex6_constrained=tests.alternatives.ex6_constrained_byte_trie
"""

import re
from dataclasses import dataclass

import torch

from gpt import check_request
from solutions.ex2_kv_cache import KVCache, forward
from solutions.ex6_constrained import CharDFA, Vocabulary, utf8_split  # noqa: F401 (the given code, re-exported)
from workshop.serving.sampling import GREEDY, make_generator, sample

EXERCISE = "ex6_constrained"


@dataclass(frozen=True)
class State:
    dfa: int  # the character-level DFA's state
    pending: bytes = b""  # bytes of a character not finished yet


def byte_trie(vocab):
    """Nested dicts {byte: child}; a node's token ids under the key None. Built once per vocabulary."""
    if getattr(vocab, "_byte_trie", None) is None:
        root = {}
        for token_id, token in enumerate(vocab.tokens):
            if token is not None:
                node = root
                for byte in token:
                    node = node.setdefault(byte, {})
                node.setdefault(None, []).append(token_id)
        vocab._byte_trie = root
    return vocab._byte_trie


class RegexConstraint:
    def __init__(self, pattern, vocab):
        self.vocab, self.pattern = vocab, pattern
        self.dfa = CharDFA(pattern)
        self.trie = byte_trie(vocab)
        self.byte_steps = {}  # State -> {byte: State or None}
        self.allowed_ids = {}  # State -> sorted token ids
        if self.dfa.initial is None or not self._ids(self.start()):
            raise ValueError(f"no token of this vocabulary can start a match of {pattern!r}: check the regex.")

    def start(self):
        return State(self.dfa.initial)

    def _step(self, state, byte):
        steps = self.byte_steps.setdefault(state, {})
        if byte not in steps:
            data = state.pending + bytes([byte])
            split, result = utf8_split(data), None
            if split is not None:
                text, unfinished = split
                if text:  # a character just finished
                    target = self.dfa.step(state.dfa, text)
                    result = None if target is None else State(target)
                elif self.dfa.can_continue(state.dfa, unfinished):
                    result = State(state.dfa, unfinished)
            steps[byte] = result
        return steps[byte]

    def _ids(self, state):
        if state not in self.allowed_ids:
            ids, todo = [], [(self.trie, state)]
            while todo:
                node, s = todo.pop()
                steps = self.byte_steps.setdefault(s, {})
                for byte, child in node.items():
                    if byte is None:
                        continue
                    t = steps[byte] if byte in steps else self._step(s, byte)
                    if t is not None:
                        ids.extend(child.get(None, ()))
                        todo.append((child, t))
            if not state.pending and state.dfa in self.dfa.accepting:
                ids.append(self.vocab.eos_token_id)
            self.allowed_ids[state] = sorted(ids)
        return self.allowed_ids[state]

    def allowed(self, state):
        return self.vocab.mask(self._ids(state))

    def advance(self, state, token_id):
        token = self.vocab.tokens[token_id]
        for byte in token or b"":
            state = None if state is None else self._step(state, byte)
        if token is None or state is None:
            raise ValueError(f"token {token_id} is not allowed here.")
        return state


class ChoiceConstraint(RegexConstraint):
    def __init__(self, choices, vocab):
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
            raise TypeError("choices must be a list of strings.")
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"choices {choices!r}: give a non-empty list of non-empty strings.")
        super().__init__("|".join(re.escape(c) for c in choices), vocab)


@torch.no_grad()
def generate(model, prompt_ids, constraint, max_new_tokens, sampling=GREEDY):
    check_request(prompt_ids, max_new_tokens, model.config.n_positions, model.config.vocab_size)
    generator, state, new_tokens = make_generator(sampling.seed), constraint.start(), []
    kv_cache = KVCache(model.config.n_layer)
    ids = list(prompt_ids)
    eos = constraint.vocab.eos_token_id
    for _ in range(max_new_tokens):
        allowed = constraint.allowed(state)
        if not allowed.any():
            raise RuntimeError("the constraint allows no token here.")
        if allowed.nonzero().flatten().tolist() == [eos]:  # the model has no choice: no forward for it
            new_tokens.append(eos)
            break
        position_ids = torch.arange(len(kv_cache), len(prompt_ids) + len(new_tokens), device=model.device)[None]
        logits = forward(model, torch.tensor([ids], device=model.device), position_ids, kv_cache)[:, -1].float().cpu()
        logits = torch.where(allowed, logits, torch.tensor(-float("inf")))
        token = sample(logits, [sampling], [generator], [list(prompt_ids) + new_tokens])[0]
        new_tokens.append(token)
        if token == eos:
            break
        state, ids = constraint.advance(state, token), [token]
    return new_tokens
