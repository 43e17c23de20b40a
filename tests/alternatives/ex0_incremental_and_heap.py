"""A different CORRECT design for exercise 0, which its checker must accept: both learning loops keep their pair
counts up to date incrementally (an index from each pair to the words holding it; only those words are
re-counted after a merge) instead of recounting the corpus every step, 0a's tables are updated by each word's
change, and 0c picks its pair from a heap with lazy deletion; 0a's encoder splits a list of uncovered segments
token by token instead of recursing; GPT-2's BPE runs as tiktoken does, on a linked list of symbols with a
heap of (rank, position), merging one occurrence at a time; the tokenizer keeps each id's bytes and an LRU cache.

    pytest exercises/test_ex0_bpe.py --impl solutions --replace ex0_bpe=tests.alternatives.ex0_incremental_and_heap
"""

import functools
import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise

import regex

from workshop.tokenizers import END_OF_TEXT, load_gpt2_bpe

EXERCISE = "ex0_bpe"
END_OF_WORD, UNKNOWN = "</w>", "<unk>"


# ----------------------------------------------------------------------------------------------
# 0a

def word_symbols(word):
    body, marker = (word[: -len(END_OF_WORD)], [END_OF_WORD]) if word.endswith(END_OF_WORD) else (word, [])
    return tuple(list(body) + marker)


def count_pairs(splits, word_counts):
    counts = Counter()
    for word, symbols in splits.items():
        for i in range(len(symbols) - 1):
            counts[symbols[i], symbols[i + 1]] += word_counts[word]
    return dict(counts)


def merge_pair(symbols, pair):
    out = list(symbols)
    i = 0
    while i < len(out) - 1:
        if (out[i], out[i + 1]) == pair:
            out[i : i + 2] = [out[i] + out[i + 1]]
        i += 1
    return tuple(out)


@dataclass
class MergeStep:
    pair: tuple
    count: int
    table: dict


@dataclass
class WordBPE:
    initial_table: dict
    steps: list
    splits: dict

    @property
    def merges(self):
        return [s.pair for s in self.steps]

    @property
    def vocabulary(self):
        table = self.steps[-1].table if self.steps else self.initial_table
        return {t: c for t, c in table.items() if c}


class _PairIndex:
    """Pair counts kept up to date: counts[pair], and which words (by index) hold each pair."""

    def __init__(self, words, counts):
        self.words, self.weights = words, counts  # lists: symbols per word, count per word
        self.counts, self.where = Counter(), defaultdict(set)
        for w in range(len(words)):
            self._add(w, +1)

    def _add(self, w, sign):
        symbols = self.words[w]
        for pair in pairwise(symbols):
            self.counts[pair] += sign * self.weights[w]
            if sign > 0:
                self.where[pair].add(w)
            elif self.counts[pair] == 0:
                del self.counts[pair]

    def merge(self, pair):
        """Merge `pair` in every word that holds it; returns {word index: (old symbols, new symbols)}."""
        changed = {}
        for w in sorted(self.where.pop(pair, ())):
            old = self.words[w]
            new = merge_pair(old, pair)
            if new != old:
                self._add(w, -1)
                self.words[w] = new
                self._add(w, +1)
                changed[w] = (old, new)
        return changed

    def first_met(self, candidates):
        """Of `candidates`, the pair whose first occurrence comes first (word order, then position)."""
        def first(pair):
            w = min(i for i in self.where[pair] if pair in zip(self.words[i], self.words[i][1:]))
            return w, next(k for k, p in enumerate(zip(self.words[w], self.words[w][1:])) if p == pair)
        return min(candidates, key=first)


def learn_word_bpe(word_counts, num_merges):
    if not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges is {num_merges!r}: give a whole number, 0 or more.")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word or any(c.isspace() for c in word) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{word!r}: {count!r} is not a word with a positive whole count.")
    names = list(word_counts)
    index = _PairIndex([word_symbols(w) for w in names], [word_counts[w] for w in names])
    table = {}
    for w, symbols in enumerate(index.words):
        for s in symbols:
            table[s] = table.get(s, 0) + index.weights[w]
    initial, steps = dict(table), []
    for _ in range(num_merges):
        if not index.counts:
            break
        top = max(index.counts.values())
        pair = index.first_met([p for p, c in index.counts.items() if c == top])
        for w, (old, new) in index.merge(pair).items():  # the table changes by each changed word's symbols
            for s in old:
                table[s] -= index.weights[w]
            for s in new:
                table[s] = table.get(s, 0) + index.weights[w]
        steps.append(MergeStep(pair, top, dict(table)))
    return WordBPE(initial, steps, dict(zip(names, index.words)))


def encode_words(text, vocabulary):
    tokens = sorted(vocabulary, key=lambda t: (-len(word_symbols(t)), -vocabulary[t], t))
    out = []
    for word in text.split():
        segments = [(False, list(word_symbols(word + END_OF_WORD)))]  # (is a token, symbols)
        for token in map(word_symbols, tokens):
            n, next_segments = len(token), []
            for done, symbols in segments:
                if done:
                    next_segments.append((done, symbols))
                    continue
                start = i = 0
                while i + n <= len(symbols):
                    if tuple(symbols[i : i + n]) == token:
                        if i > start:
                            next_segments.append((False, symbols[start:i]))
                        next_segments.append((True, list(token)))
                        i = start = i + n
                    else:
                        i += 1
                if start < len(symbols):
                    next_segments.append((False, symbols[start:]))
            segments = next_segments
        out += ["".join(symbols) if done else UNKNOWN for done, symbols in segments]
    return out


def decode_words(tokens):
    return regex.sub(r" $", "", "".join(tokens).replace(END_OF_WORD, " "))


# ----------------------------------------------------------------------------------------------
# 0b

_PATTERN = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    visible = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in visible else chr(next(shifted)) for b in range(256)}


def pretokenize(text):
    return [m.group() for m in _PATTERN.finditer(text)]


def apply_merges(word, ranks):
    """tiktoken's way: a linked list of symbols and a heap of (rank, position) of ranked pairs; pop the lowest rank
    (leftmost on a tie), merge that ONE occurrence, push the two new neighbouring pairs; stale entries are skipped."""
    symbols = list(word)
    nxt, prv = list(range(1, len(symbols) + 1)), list(range(-1, len(symbols) - 1))
    alive = [True] * len(symbols)
    heap = [(ranks[p], i, p) for i, p in enumerate(pairwise(symbols)) if p in ranks]
    heapq.heapify(heap)
    while heap:
        _, i, pair = heapq.heappop(heap)
        j = nxt[i] if i < len(symbols) and alive[i] else len(symbols)
        if j >= len(symbols) or (symbols[i], symbols[j]) != pair:
            continue  # stale: one of the two was merged away since
        symbols[i] += symbols[j]
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] < len(symbols):
            prv[nxt[j]] = i
        for a in (prv[i], i):
            if a >= 0 and nxt[a] < len(symbols):
                p = (symbols[a], symbols[nxt[a]])
                if p in ranks:
                    heapq.heappush(heap, (ranks[p], a, p))
    return [s for s, keep in zip(symbols, alive) if keep]


def _check_text(text):
    if not isinstance(text, str):
        raise ValueError(f"encode() takes a str, got {type(text).__name__}.")  # noqa: TRY004


class ByteLevelBPE:
    def __init__(self, encoder, merges, special_tokens=None):
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        self.encoder = dict(encoder)
        self.ranks = {tuple(p): r for r, p in enumerate(merges)}
        self.special_tokens = dict(special_tokens or {})
        self.byte_encoder = bytes_to_unicode()
        self.token_bytes = {i: bytes(byte_of[c] for c in t) for t, i in self.encoder.items()}
        self.token_bytes.update({i: t.encode() for t, i in self.special_tokens.items()})
        self._piece_ids = functools.lru_cache(maxsize=1 << 16)(self._encode_piece)

    @classmethod
    def gpt2(cls):
        encoder, merges = load_gpt2_bpe()
        return cls(encoder, merges, {END_OF_TEXT: encoder[END_OF_TEXT]})

    @classmethod
    def from_merges(cls, merges, special_tokens=()):
        encoder = {c: i for i, c in enumerate(sorted(bytes_to_unicode().values()))}
        for a, b in merges:
            encoder.setdefault(a + b, len(encoder))
        return cls(encoder, merges, {t: len(encoder) + i for i, t in enumerate(special_tokens)})

    def __len__(self):
        return len(self.token_bytes)

    def _encode_piece(self, piece):
        return tuple(self.encoder[t] for t in apply_merges("".join(self.byte_encoder[b] for b in piece.encode()), self.ranks))

    def encode_ordinary(self, text):
        _check_text(text)
        return [i for piece in pretokenize(text) for i in self._piece_ids(piece)]

    def encode(self, text):
        _check_text(text)
        ids, start = [], 0
        if self.special_tokens:
            for m in regex.finditer("|".join(map(regex.escape, sorted(self.special_tokens, key=len, reverse=True))), text):
                ids += self.encode_ordinary(text[start : m.start()]) + [self.special_tokens[m.group()]]
                start = m.end()
        return ids + self.encode_ordinary(text[start:])

    def decode(self, ids):
        if any(not isinstance(i, int) or i not in self.token_bytes for i in ids):
            raise ValueError("an id is not in the vocabulary: decode only ids that encode() returned.")
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------
# 0c

def train_byte_bpe(text, vocab_size):
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: give 256 or more.")
    counted = Counter(pretokenize(text))
    to_char = bytes_to_unicode()
    index = _PairIndex([tuple(to_char[b] for b in w.encode()) for w in counted], list(counted.values()))
    ids = {c: i for i, c in enumerate(sorted(to_char.values()))}
    heap = [(-c, ids[a], ids[b], (a, b)) for (a, b), c in index.counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(ids) < vocab_size and heap:
        neg, _, _, pair = heapq.heappop(heap)
        if index.counts.get(pair, 0) != -neg:
            continue  # stale: the count changed; the pair (if still there) was pushed again with its new count
        merges.append(pair)
        ids.setdefault(pair[0] + pair[1], len(ids))
        touched = set()
        for old, new in index.merge(pair).values():
            touched.update(pairwise(old))
            touched.update(pairwise(new))
        for p in touched - {pair}:
            if index.counts.get(p, 0) > 0:
                heapq.heappush(heap, (-index.counts[p], ids[p[0]], ids[p[1]], p))
    return merges
