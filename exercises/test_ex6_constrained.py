"""Checker for exercise 6, constrained decoding: pytest exercises/test_ex6_constrained.py (-k 6e, -k 6f)

6e: choices. The masks are compared with the rule itself (a token is allowed when the text stays a
    prefix of some choice; EOS on a whole choice) on a toy vocabulary and on GPT-2's, along seeded token
    paths that spell choices in unusual ways; generated outputs are always a choice, and equal the
    reference's, greedy and sampled with a seed.
6f: regex. Hand-checked masks on a toy vocabulary (partial UTF-8 tokens, EOS only where the regex
    accepts), then GPT-2's whole vocabulary against outlines-core's Index (the outside reference) in
    every state of seeded token paths through several regexes; outputs always re.fullmatch.
"""

import copy
import random
import re
import time

import pytest
import torch
from hypothesis import strategies as st

import solutions.ex6_constrained as reference
from gpt import GPTConfig
from workshop.grading.wording import plural
from workshop.grading.differential import Twins, explore, record
from workshop.grading.scenarios import around, small_config, small_model
from workshop.grading.harness import (
    compare_tokens,
    count_model_work,
    describe_token_mismatch,
    implementation,
    paired_timing,
)
from workshop.serving.sampling import GREEDY, SamplingParams
from workshop.serving.workloads import sample_prompts

HINTS = "exercises/hints/ex6_constrained.md"
# each public name of the stub -> the check that runs it against the reference on generated scenarios
PARTS = {  # each part, in the contract's order -> the stub's TODOs it starts (tests/test_parts.py grades each part alone)
    "6e": ["ChoiceConstraint.__init__", "ChoiceConstraint.allowed", "ChoiceConstraint.advance", "generate"],
    "6f": ["RegexConstraint.__init__", "RegexConstraint.allowed", "RegexConstraint.advance"],
}
DIFFERENTIAL_API = {name: "test_differential_6e_choices" for name in
                    ("utf8_split", "Vocabulary", "Vocabulary.mask", "Vocabulary.decode", "ChoiceConstraint", "ChoiceConstraint.start",
                     "ChoiceConstraint.allowed", "ChoiceConstraint.advance")}
DIFFERENTIAL_API |= {"Vocabulary.from_tokenizer": "test_differential_6e_choices", "generate": "test_differential_6e_generate"}
DIFFERENTIAL_API |= {name: "test_differential_6f_regex" for name in
                     ("CharDFA", "CharDFA.step", "CharDFA.can_continue", "RegexConstraint", "RegexConstraint.start",
                      "RegexConstraint.allowed", "RegexConstraint.advance")}

# Choices: words from the model's world (several tokens each, some sharing a start, some non-ASCII);
# each run adds made-up words, so no list can be hard-coded.
CHOICE_WORDS = [" yes", " no", " maybe", " Romeo", " Juliet", " the king", " the king's men", " my lord", " my lady",
                " good night", " good morrow", " café au lait", " naïve", " to be", " to be or not to be", "I know not",
                " ☺", " Northumberland"]

# Regexes for generation: every match is short, so max_new_tokens below always suffices.
GENERATION_REGEXES = [r"[0-9]{1,3}", r"(yes|no|perhaps)", r'\{"name": "[a-z]{1,8}", "age": [0-9]{1,2}\}',
                      r" [A-Z][a-z]{1,6}", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"(café|naïve) [a-z]{1,5}", r"[a-z ]{2,12}\."]
MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def student():
    return implementation("ex6_constrained")


@pytest.fixture(scope="module")
def vocab(student, tokenizer):
    return student.Vocabulary.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def ref_vocab(tokenizer):
    return reference.Vocabulary.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def prompts(model, seed):
    return sample_prompts(model, 3, 2, 24, seed + 6)


def show(vocab, token_id):
    return "EOS" if token_id == vocab.eos_token_id else f"{token_id} {vocab.tokens[token_id]!r}"


def ids_of(mask, vocab, what):
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == (vocab.size,), (
        f"{what} should return a torch.bool tensor of shape [{vocab.size}] (one entry per token of the vocabulary), got "
        f"{type(mask).__name__} {getattr(mask, 'dtype', '')} {tuple(getattr(mask, 'shape', ()))} (see {HINTS}).")
    return set(mask.nonzero().flatten().tolist())


def describe_mask_difference(got, expected, vocab, where, hint):
    """None when equal; else a paragraph naming tokens allowed wrongly and forbidden wrongly."""
    if got == expected:
        return None
    extra, missing = sorted(got - expected), sorted(expected - got)
    lines = [f"{where}: your mask allows {plural(len(got), 'token')}, expected {len(expected)}."]
    if extra:
        lines.append(f"  allowed but must not be ({len(extra)}): " + ", ".join(show(vocab, t) for t in extra[:6]))
    if missing:
        lines.append(f"  forbidden but must be allowed ({len(missing)}): " + ", ".join(show(vocab, t) for t in missing[:6]))
    return "\n".join(lines + [hint])


class VocabTokenizer:
    """describe_token_mismatch decodes with a tokenizer: this one decodes with the vocabulary's bytes."""

    def __init__(self, vocab):
        self.vocab = vocab

    def decode(self, ids):
        return self.vocab.decode(ids)


def toy_vocabulary(student, pieces):
    """A small vocabulary: the given byte strings, then EOS (a special token, None) as the last id."""
    return student.Vocabulary([*pieces, None], eos_token_id=len(pieces))


# ----------------------------------------------------------------------------------------------
# 6e: choices

def choice_rule(choices, vocab, text):
    """The rule itself: token t is allowed after `text` (bytes) when text + t is a prefix of some choice,
    EOS when text is a choice."""
    encoded = [c.encode() for c in choices]
    prefixes = {c[:i] for c in encoded for i in range(len(c) + 1)}
    allowed = {i for i, t in enumerate(vocab.tokens) if t is not None and text + t in prefixes}
    return allowed | ({vocab.eos_token_id} if text in encoded else set())


def seeded_choices(rng):
    made_up = [" " + "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4)))
               for _ in range(2)]
    words = rng.sample(CHOICE_WORDS, rng.randint(3, 5)) + made_up
    if rng.random() < 0.7:  # a choice that is a prefix of another: EOS and further tokens both allowed there
        words.append(" to be" if " to be or not to be" in words else " the king")
    rng.shuffle(words)
    return list(dict.fromkeys(words))


def test_6e_bad_choices_are_refused(student, vocab):
    """An empty list, an empty choice, a bare string, choices that are not strings (or not in a list): a ValueError (or
    TypeError) with one clear sentence, before any work."""
    for bad, why in [([], "an empty list of choices"), ([" yes", ""], "a choice that is the empty string"),
                     ([""], "only an empty choice")]:
        with pytest.raises(ValueError) as error:
            student.ChoiceConstraint(bad, vocab)
        message = str(error.value)
        assert message and "\n" not in message.strip(), (
            f"ChoiceConstraint({bad!r}) ({why}) should raise ValueError with one clear sentence, got {message!r} (see {HINTS}, "
            f"ChoiceConstraint.__init__, hint 1).")
    with pytest.raises((TypeError, ValueError)):
        student.ChoiceConstraint(" yes", vocab)  # a bare string is not a list of choices
    for bad in ([" yes", 3], [b" yes"], {" yes": 1}):  # not a list (or tuple) of strings
        with pytest.raises((TypeError, ValueError)):
            student.ChoiceConstraint(bad, vocab)


def test_6e_masks_on_a_toy_vocabulary(student):
    """A handful of tokens: every state reachable from the start, its mask by the rule, EOS on whole choices,
    half a UTF-8 character (b'\\xc3' of 'é') as a step, and a forbidden token refused by advance."""
    vocab = toy_vocabulary(student, [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca", b"\xc3", b"\xa9", b"\xc3\xa9", b" "])
    choices = ["abc", "ab", "bé", "cab"]
    constraint = student.ChoiceConstraint(choices, vocab)
    todo, seen = [(constraint.start(), b"", [])], set()
    while todo:
        state, text, path = todo.pop(0)
        if text in seen:
            continue
        seen.add(text)
        expected = choice_rule(choices, vocab, text)
        got = ids_of(constraint.allowed(state), vocab, "ChoiceConstraint.allowed")
        problem = describe_mask_difference(got, expected, vocab, f"toy vocabulary {vocab.tokens[:-1]}, choices {choices}, "
                                           f"after the tokens {[vocab.tokens[t] for t in path]} (text {text!r})",
                                           f"A token is allowed when the text followed by its bytes is still a PREFIX of some "
                                           f"choice, even if the choice needs more tokens after it; EOS exactly when the text "
                                           f"is a whole choice (see {HINTS}, ChoiceConstraint.allowed, hint 1).")
        assert problem is None, problem
        for token in sorted(expected - {vocab.eos_token_id}):
            todo.append((constraint.advance(state, token), text + vocab.tokens[token], path + [token]))
    with pytest.raises(ValueError):
        constraint.advance(constraint.start(), vocab.index[b"bc"])  # "bc" starts no choice


def test_6e_masks_on_gpt2(student, vocab, seed):
    """GPT-2's vocabulary, seeded choices of several tokens each: along seeded paths that spell choices in
    every way (short tokens, single bytes, the usual tokens), each state's mask follows the rule."""
    rng = random.Random(seed + 61)
    for _ in range(3):
        choices = seeded_choices(rng)
        constraint = student.ChoiceConstraint(choices, vocab)
        for _ in range(2):
            state, text, path = constraint.start(), b"", []
            while True:
                expected = choice_rule(choices, vocab, text)
                got = ids_of(constraint.allowed(state), vocab, "ChoiceConstraint.allowed")
                problem = describe_mask_difference(
                    got, expected, vocab, f"choices {choices}, after the tokens {[vocab.tokens[t] for t in path]} (text {text!r})",
                    f"Every token after which the text is still a prefix of some choice is allowed: a choice may need several "
                    f"tokens, and may be spelled by other tokens than the tokenizer's own (see {HINTS}, ChoiceConstraint.allowed).")
                assert problem is None, problem
                tokens = sorted(expected - {vocab.eos_token_id})
                if not tokens or (vocab.eos_token_id in expected and rng.random() < 0.3):
                    break
                short = [t for t in tokens if len(vocab.tokens[t]) <= 2]
                token = rng.choice(short if short and rng.random() < 0.6 else tokens)
                state, text, path = constraint.advance(state, token), text + vocab.tokens[token], path + [token]


class CountingList(list):
    """A list that counts the loops over it (an index lookup is no loop)."""
    loops = 0

    def __iter__(self):
        CountingList.loops += 1
        return super().__iter__()


class CountingDict(dict):
    """A dict that counts the loops over it, as CountingList (a lookup is no loop)."""

    def __iter__(self):
        CountingList.loops += 1
        return super().__iter__()

    def items(self):
        CountingList.loops += 1
        return super().items()

    def keys(self):
        CountingList.loops += 1
        return super().keys()

    def values(self):
        CountingList.loops += 1
        return super().values()


def test_6e_allowed_costs_the_choices_not_the_vocabulary(student, vocab, seed):
    """A new state's mask costs lookups along the choices (vocab.index, bytes -> id), never a loop over the
    vocabulary's 50,257 tokens: along seeded paths through GPT-2's vocabulary, no allowed() or advance() after the
    first mask loops over vocab.tokens, vocab.texts or vocab.index (work done once per vocabulary, before, is fine)."""
    rng = random.Random(seed + 69)
    counted = copy.copy(vocab)
    counted.tokens, counted.texts, counted.index = CountingList(vocab.tokens), CountingList(vocab.texts), CountingDict(vocab.index)
    for _ in range(2):
        choices = seeded_choices(rng)
        constraint = student.ChoiceConstraint(choices, counted)
        state, text = constraint.start(), b""
        ids_of(constraint.allowed(state), vocab, "ChoiceConstraint.allowed")  # once per constraint: anything goes
        CountingList.loops = 0
        states = 0
        while True:
            allowed = choice_rule(choices, vocab, text) - {vocab.eos_token_id}
            if not allowed:
                break
            token = rng.choice(sorted(allowed))
            state, text = constraint.advance(state, token), text + vocab.tokens[token]
            constraint.allowed(state)
            states += 1
        assert CountingList.loops == 0, (
            f"choices {choices}: the masks of {states} new states (after the first) looped {CountingList.loops} times over the "
            f"vocabulary (vocab.tokens, vocab.texts or vocab.index). A state's mask costs lookups along the choices, not a "
            f"walk over 50,257 tokens: for each choice the state starts, look every start of the rest of it up in vocab.index "
            f"(see {HINTS}, ChoiceConstraint.allowed).")


def test_6e_advance_refuses_eos_and_forbidden_tokens(student):
    """advance() with a token allowed() forbids, or with a special token (EOS: it ends the output, it is no text),
    is the caller's bug: a ValueError, even where EOS is allowed (the text is a whole choice)."""
    vocab = toy_vocabulary(student, [b"a", b"b", b"ab", b"c"])
    constraint = student.ChoiceConstraint(["ab", "abc"], vocab)
    whole = constraint.advance(constraint.start(), vocab.index[b"ab"])  # a whole choice: EOS allowed here
    for state, token, why in ((constraint.start(), vocab.eos_token_id, "EOS at the start"),
                              (whole, vocab.eos_token_id, "EOS after the whole choice 'ab'"),
                              (whole, vocab.index[b"b"], "b'b' after 'ab' (no choice starts 'abb')"),
                              (constraint.start(), vocab.index[b"c"], "b'c' at the start")):
        with pytest.raises(ValueError):
            constraint.advance(state, token)


class NothingAllowed:
    """A broken constraint: after `after` tokens (any), its mask allows no token at all."""

    def __init__(self, vocab, after):
        self.vocab, self.after = vocab, after

    def start(self):
        return 0

    def allowed(self, state):
        mask = torch.zeros(self.vocab.size, dtype=torch.bool)
        if state < self.after:
            mask[:100] = True
        return mask

    def advance(self, state, token_id):
        return state + 1


def test_6e_generate_refuses_a_mask_that_allows_nothing(student, model, vocab, prompts):
    """A mask that allows no token at all (a broken constraint) makes generate raise, at the start or later: never
    a token picked from logits that are all -inf."""
    for after in (0, 2):
        try:
            got = student.generate(model, prompts[0], NothingAllowed(vocab, after), 6)
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 (any error that says the constraint is broken will do)
            continue
        raise AssertionError(
            f"a constraint whose mask allows no token after {after} tokens: generate returned {got} instead of raising. A "
            f"mask with nothing allowed means a broken constraint: raise, never pick from all -inf (see {HINTS}, generate).")


def check_output_is_a_choice(got, choices, vocab, prompt, max_new_tokens, what):
    assert isinstance(got, list) and all(isinstance(t, int) for t in got), f"generate should return a list of Python ints, got {got!r}."
    text = vocab.decode(got)
    assert len(got) <= max_new_tokens, f"{what}: {plural(len(got), 'token')} came back for max_new_tokens={max_new_tokens}."
    if got and got[-1] == vocab.eos_token_id:
        assert text in choices, (f"{what}: the output {text!r} (ended by EOS) is not one of the choices {choices} "
                                 f"(prompt ...{vocab.decode(prompt)[-60:]!r}). Every token must come from the mask, and EOS only "
                                 f"on a whole choice (see {HINTS}, generate, hint 1).")
    else:
        assert len(got) == max_new_tokens and any(c.startswith(text) for c in choices), (
            f"{what}: the output {text!r} neither ended with EOS on a choice nor is a start of one cut by max_new_tokens="
            f"{max_new_tokens} (see {HINTS}, generate, hint 2).")


def test_6e_generate_greedy_gives_a_choice(student, model, tokenizer, vocab, ref_vocab, prompts, seed):
    """Greedy: the output is always one of the choices, the same as the reference's, through the KV cache
    (one token per decode step); a short max_new_tokens gives the start of a choice."""
    rng = random.Random(seed + 62)
    for prompt in prompts:
        choices = seeded_choices(rng)
        constraint = student.ChoiceConstraint(choices, vocab)
        with count_model_work(model) as work:
            got = student.generate(model, prompt, constraint, MAX_NEW_TOKENS)
        check_output_is_a_choice(got, choices, vocab, prompt, MAX_NEW_TOKENS, "greedy")
        with count_model_work(model) as ref_work:
            expected = reference.generate(model, prompt, reference.ChoiceConstraint(choices, ref_vocab), MAX_NEW_TOKENS)
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, (f"greedy generation with choices {choices} differs from the reference's.\n{problem}\n"
                                 f"Mask the logits (forbidden: -inf), then take the argmax (see {HINTS}, generate, hint 2).")
        assert work.forward_passes <= len(got) and work.tokens == len(prompt) + work.forward_passes - 1, (
            f"{work.forward_passes} forward passes pushing {work.tokens} tokens for a {len(prompt)}-token prompt and {len(got)} new "
            f"tokens: prefill the prompt once, then one token per forward through the KV cache (see {HINTS}, generate, hint 2).")
        assert work.forward_passes == ref_work.forward_passes, (  # the same tokens: only a forced EOS may differ
            f"{work.forward_passes} forward passes for {vocab.decode(got)!r}, the reference's {ref_work.forward_passes}: when the "
            f"mask allows nothing but EOS, append it without running the model (the model has no choice to make).")
        longest = max(choices, key=lambda c: len(tokenizer.encode(c)))
        cut = student.generate(model, prompt, student.ChoiceConstraint([longest], vocab), 2)
        check_output_is_a_choice(cut, [longest], vocab, prompt, 2, "max_new_tokens=2")


def test_6e_generate_sampled_gives_a_choice(student, model, vocab, ref_vocab, prompts, seed):
    """Sampled with a seed (exercise 6's sampler): always one of the choices, the same tokens as the reference
    for the same seed, and the same again when repeated."""
    rng = random.Random(seed + 63)
    for i, prompt in enumerate(prompts):
        choices = seeded_choices(rng)
        sampling = SamplingParams(temperature=1.3, top_k=[0, 50][i % 2], repetition_penalty=[1.0, 1.2][i % 2], seed=seed + i)
        got = student.generate(model, prompt, student.ChoiceConstraint(choices, vocab), MAX_NEW_TOKENS, sampling)
        check_output_is_a_choice(got, choices, vocab, prompt, MAX_NEW_TOKENS, f"sampled ({sampling})")
        expected = reference.generate(model, prompt, reference.ChoiceConstraint(choices, ref_vocab), MAX_NEW_TOKENS, sampling)
        problem = describe_token_mismatch(got, expected, VocabTokenizer(vocab), prompt)
        assert problem is None, (f"sampled generation ({sampling}) with choices {choices} differs from the reference's.\n{problem}\n"
                                 f"Use one generator, make_generator(sampling.seed), for the request, and sample(masked logits, "
                                 f"[sampling], [generator], [prompt + tokens so far]) once per model step (see {HINTS}, generate, hint 2).")
        again = student.generate(model, prompt, student.ChoiceConstraint(choices, vocab), MAX_NEW_TOKENS, sampling)
        assert again == got, f"the same seed gave {vocab.decode(got)!r}, then {vocab.decode(again)!r}: seed the generator."


def test_6e_no_eos_while_bytes_are_pending(student):
    """Half a UTF-8 character is no text yet: with choices "a" and "aé", after b"a" then b"\\xc3" (the first byte
    of "é") EOS is forbidden, and only the byte that completes "é" may follow."""
    vocab = toy_vocabulary(student, [b"a", b"\xc3", b"\xa9", b"\xbc", "é".encode(), b"b"])
    constraint = student.ChoiceConstraint(["a", "aé"], vocab)
    state = constraint.advance(constraint.advance(constraint.start(), vocab.index[b"a"]), vocab.index[b"\xc3"])
    got = ids_of(constraint.allowed(state), vocab, "ChoiceConstraint.allowed")
    problem = describe_mask_difference(
        got, {vocab.index[b"\xa9"]}, vocab, "choices ['a', 'aé'], after the tokens [b'a', b'\\xc3'] (text b'a\\xc3', half of 'é')",
        f"The state is BYTES: b'a\\xc3' is not the choice 'a' (decoding it and dropping the unfinished byte makes it look like "
        f"one). EOS only when the bytes equal a choice (see {HINTS}, ChoiceConstraint.allowed).")
    assert problem is None, problem


def test_6e_repetition_penalty_counts_the_prompt(student, model, vocab, ref_vocab, seed):
    """The repetition penalty's history is the prompt AND the tokens so far (as in transformers and the engines).
    Each prompt ends with the model's own favourite choice (and, if need be, its favourite next token), so that
    token is in the prompt; greedy with a strong penalty must then take another one. Cases are kept only where
    counting the prompt changes the first token, so leaving the prompt out of the history shows."""
    rng = random.Random(seed + 67)
    penalty = 4.0
    penalised = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    cases = []
    for prompt in sample_prompts(model, 16, 4, 20, seed + 68):
        choices = seeded_choices(rng)
        constraint = reference.ChoiceConstraint(choices, ref_vocab)
        favourite = reference.generate(model, prompt, constraint, MAX_NEW_TOKENS)
        prompt = prompt + [t for t in favourite if t != ref_vocab.eos_token_id]  # the prompt now says that choice
        for _ in range(3):
            with torch.no_grad():
                logits = model(torch.tensor([prompt], device=model.device), torch.arange(len(prompt), device=model.device)[None])[0, -1]
            logits = logits.float().cpu().masked_fill(~constraint.allowed(constraint.start()), -float("inf"))
            plain = int(logits.argmax())
            if plain not in prompt:
                prompt = prompt + [plain]  # say it once more: now it is in the prompt
                continue
            in_prompt = torch.zeros_like(logits, dtype=torch.bool)
            in_prompt[prompt] = True
            if int(torch.where(in_prompt, torch.where(logits < 0, logits * penalty, logits / penalty), logits).argmax()) != plain:
                cases.append((prompt, choices))
            break
        if len(cases) == 3:
            break
    assert cases, "checker bug: no prompt where the penalty on the prompt's tokens changes the first token; run with another --seed."
    for prompt, choices in cases:
        got = student.generate(model, prompt, student.ChoiceConstraint(choices, vocab), MAX_NEW_TOKENS, penalised)
        check_output_is_a_choice(got, choices, vocab, prompt, MAX_NEW_TOKENS, f"greedy with {penalised}")
        expected = reference.generate(model, prompt, reference.ChoiceConstraint(choices, ref_vocab), MAX_NEW_TOKENS, penalised)
        problem = describe_token_mismatch(got, expected, VocabTokenizer(vocab), prompt)
        assert problem is None, (
            f"greedy with repetition_penalty=4 and choices {choices}: yours differs from the reference's.\n{problem}\n"
            f"The prompt's tokens are in the row's history from the first step on (this prompt already says a choice): pass "
            f"sample() the prompt AND the tokens so far as the history, not the new tokens alone (see {HINTS}, generate).")


# ----------------------------------------------------------------------------------------------
# 6f: regex

TOY_REGEX = r"[0-9]{2}|é1"
TOY_PIECES = [b"1", b"2", b"12", b"123", b"a", b"1a", "é".encode(), b"\xc3", b"\xa9", b" 1"]
TOY_EXPECTED = {  # path of token texts -> the tokens allowed next ("EOS" for the end), checked by hand
    (): {b"1", b"2", b"12", "é".encode(), b"\xc3"},  # not b"123" (too long), b"1a", b"a", b"\xa9" (not UTF-8 alone)
    (b"1",): {b"1", b"2"},  # not b"12": "112" is three digits
    (b"12",): {"EOS"},
    (b"\xc3",): {b"\xa9"},  # the second byte of "é"; nothing else completes a character the regex wants
    (b"1", b"2"): {"EOS"},  # the same state as after b"12", reached another way
    (b"\xc3", b"\xa9"): {b"1"},
    ("é".encode(),): {b"1"},  # the same state as after b"\xc3", b"\xa9"
    ("é".encode(), b"1"): {"EOS"},
}


def test_6f_bad_regex_is_refused(student, vocab):
    """A regex no token can start (a vocabulary without digits for [0-9]+; a regex that matches nothing), or
    one interegular cannot parse: a ValueError with one clear sentence, before any generation."""
    letters = toy_vocabulary(student, [b"a", b"b", b"ab"])
    cases = [(r"[0-9]+", letters, "a vocabulary without digits"), (r"[^\s\S]", vocab, "a regex that matches nothing"),
             (r"(a)\1", vocab, "a backreference"), (r"(?<=a)b", vocab, "a lookbehind"), (r"[a-", vocab, "an unclosed class")]
    for pattern, v, why in cases:
        with pytest.raises(ValueError) as error:
            student.RegexConstraint(pattern, v)
        message = str(error.value)
        assert message and "\n" not in message.strip(), (
            f"RegexConstraint({pattern!r}) ({why}) should raise ValueError with one clear sentence, got {message!r} "
            f"(see {HINTS}, RegexConstraint.__init__).")


def test_6f_masks_on_a_toy_vocabulary(student):
    """Checked by hand: whole tokens walked (not just their first character), half a UTF-8 character pending
    and completed by the next token, EOS only where the regex accepts, equal states reached by different paths."""
    vocab = toy_vocabulary(student, TOY_PIECES)
    constraint = student.RegexConstraint(TOY_REGEX, vocab)
    for path, allowed in TOY_EXPECTED.items():
        state = constraint.start()
        for piece in path:
            state = constraint.advance(state, vocab.index[piece])
        expected = {vocab.eos_token_id if a == "EOS" else vocab.index[a] for a in allowed}
        got = ids_of(constraint.allowed(state), vocab, "RegexConstraint.allowed")
        problem = describe_mask_difference(
            got, expected, vocab, f"regex {TOY_REGEX!r}, toy vocabulary {TOY_PIECES}, after the tokens {list(path)}",
            f"Walk every character of a token through the DFA; keep the bytes of an unfinished character pending (they "
            f"are allowed when some character starting with them can follow); EOS only in an accepting state with nothing "
            f"pending; one cached mask per state, the whole state as the key (see {HINTS}, RegexConstraint.allowed).")
        assert problem is None, problem
    with pytest.raises(ValueError):
        constraint.advance(constraint.start(), vocab.index[b"a"])


PENDING_REGEX = r"[0-9]{1,2}(é|ü)?"
PENDING_PIECES = [b"1", b"2", "é".encode(), b"\xc3", b"\xa9", b"\xbc", b"a"]
PENDING_EXPECTED = {  # path -> allowed next, by hand: after b"1" the regex accepts, but not with b"\xc3" pending
    (b"1",): {b"1", b"2", "é".encode(), b"\xc3", "EOS"},
    (b"1", b"\xc3"): {b"\xa9", b"\xbc"},  # no EOS: half of "é" or "ü" is pending
    (b"1", b"2", b"\xc3"): {b"\xa9", b"\xbc"},
    (b"1", b"\xc3", b"\xa9"): {"EOS"},
}


def test_6f_no_eos_while_a_character_is_pending(student):
    """EOS is allowed in an accepting state only with nothing pending: after "1" the regex [0-9]{1,2}(é|ü)? accepts,
    but after "1" + b"\\xc3" (half of "é" or "ü") the output would end in half a character: EOS is forbidden there."""
    vocab = toy_vocabulary(student, PENDING_PIECES)
    constraint = student.RegexConstraint(PENDING_REGEX, vocab)
    for path, allowed in PENDING_EXPECTED.items():
        state = constraint.start()
        for piece in path:
            state = constraint.advance(state, vocab.index[piece])
        expected = {vocab.eos_token_id if a == "EOS" else vocab.index[a] for a in allowed}
        got = ids_of(constraint.allowed(state), vocab, "RegexConstraint.allowed")
        problem = describe_mask_difference(
            got, expected, vocab, f"regex {PENDING_REGEX!r}, toy vocabulary {PENDING_PIECES}, after the tokens {list(path)}",
            f"EOS needs an accepting DFA state AND no pending bytes: the DFA state before an unfinished character may "
            f"accept, but the text would end in half a character (see {HINTS}, RegexConstraint.allowed).")
        assert problem is None, problem


# Regexes for the comparison with outlines-core, with seeded sizes. Each is written in the syntax that
# Python's re, interegular and Rust's regex (outlines-core) read the same way.
def outlines_regexes(rng):
    accented = rng.sample(["café", "naïve", "crème", "😀", "Ångström", "über"], 3)
    return [
        rf"[0-9]{{1,{rng.randint(2, 4)}}}(\.[0-9]{{1,2}})?",  # numbers
        rf'\{{"name": "[A-Za-z ]{{1,{rng.randint(6, 14)}}}", "age": [0-9]{{1,2}}\}}',  # JSON-ish
        "(" + "|".join(accented) + rf") [a-z]{{1,{rng.randint(3, 8)}}}",  # non-ASCII: tokens end inside characters
        rf'[^"\n]{{0,{rng.randint(3, 8)}}}"',  # a negated class: any character, bytes pending included
        rf".{{1,{rng.randint(2, 5)}}}",  # any character but a newline
    ]


@pytest.fixture(scope="module")
def outlines_vocabulary(ref_vocab):
    from outlines_core import Vocabulary

    return Vocabulary(ref_vocab.eos_token_id, {token: [i] for token, i in ref_vocab.index.items()})


def outlines_quirk(ref, ref_state, allowed, vocab):
    """The tokens outlines-core 0.2.14 leaves out although they keep the text on its way to a match: those
    after whose bytes but the last the text already matches while the whole text does not (regex-automata
    reports a match one byte late; outlines' Index drops an end state flagged so unless it matches fully).
    For example after "12", "." for [0-9]{1,3}(\\.[0-9]{1,2})?: outlines allows ".5" but not "."."""
    accepts = ref.dfa.accepting
    quirk = set()
    for token in allowed - {vocab.eos_token_id}:
        before_last, whole = ref._walk(ref_state, vocab.tokens[token][:-1]), ref._walk(ref_state, vocab.tokens[token])
        if before_last is not None and before_last[1] == b"" and before_last[0] in accepts and (whole[1] or whole[0] not in accepts):
            quirk.add(token)
    return quirk


def test_6f_masks_equal_outlines_core(student, vocab, ref_vocab, outlines_vocabulary, seed):
    """GPT-2's whole vocabulary: in every state of seeded token paths through five kinds of regexes, your mask
    equals the one outlines-core's Index computes (up to its one documented quirk, see outlines_quirk)."""
    from outlines_core import Index

    rng = random.Random(seed + 64)
    for pattern in outlines_regexes(rng):
        index = Index(pattern, outlines_vocabulary)
        constraint, ref = student.RegexConstraint(pattern, vocab), reference.RegexConstraint(pattern, ref_vocab)
        for _ in range(2):
            state, ref_state, theirs, path = constraint.start(), ref.start(), index.get_initial_state(), []
            for _ in range(8):
                outlines_allowed = set(index.get_allowed_tokens(theirs) or [])
                ref_allowed = ids_of(ref.allowed(ref_state), ref_vocab, "the reference")
                expected = outlines_allowed | outlines_quirk(ref, ref_state, ref_allowed, ref_vocab)
                got = ids_of(constraint.allowed(state), vocab, "RegexConstraint.allowed")
                problem = describe_mask_difference(
                    got, expected, vocab, f"regex {pattern!r}, after the tokens {[vocab.tokens[t] for t in path]}",
                    f"(expected: outlines-core's mask). Walk each token's whole text through the DFA; a token ending inside a "
                    f"UTF-8 character is allowed when some character starting with its last bytes can follow; EOS only in an "
                    f"accepting state with nothing pending (see {HINTS}, RegexConstraint.allowed).")
                assert problem is None, problem
                tokens = sorted(outlines_allowed - {vocab.eos_token_id})
                if not tokens:
                    break
                partial = [t for t in tokens if vocab.texts[t] is None or vocab.texts[t][1]]
                token = rng.choice(partial if partial and rng.random() < 0.4 else tokens)
                state, ref_state, theirs = constraint.advance(state, token), ref.advance(ref_state, token), index.get_next_state(theirs, token)
                path.append(token)


def check_output_matches(got, pattern, vocab, prompt, what):
    assert isinstance(got, list) and all(isinstance(t, int) for t in got), f"generate should return a list of Python ints, got {got!r}."
    text = vocab.decode(got)
    assert got and got[-1] == vocab.eos_token_id and re.fullmatch(pattern, text), (
        f"{what}: the output {text!r} ({plural(len(got), 'token')}{', ended by EOS' if got and got[-1] == vocab.eos_token_id else ', no EOS'}) "
        f"does not fully match the regex {pattern!r} (prompt ...{vocab.decode(prompt)[-60:]!r}). Every token must come from "
        f"the mask of the current state, and EOS only where the regex accepts (see {HINTS}, RegexConstraint.allowed and generate).")


def test_6f_generate_greedy_matches(student, model, tokenizer, vocab, ref_vocab, prompts, seed):
    """Greedy under seeded regexes: the output always fully matches, and equals the reference's."""
    rng = random.Random(seed + 65)
    for prompt in prompts:
        for pattern in rng.sample(GENERATION_REGEXES, 2):
            got = student.generate(model, prompt, student.RegexConstraint(pattern, vocab), MAX_NEW_TOKENS)
            check_output_matches(got, pattern, vocab, prompt, "greedy")
            expected = reference.generate(model, prompt, reference.RegexConstraint(pattern, ref_vocab), MAX_NEW_TOKENS)
            problem = compare_tokens(got, expected, model, prompt, tokenizer)
            assert problem is None, f"greedy generation under {pattern!r} differs from the reference's.\n{problem}\n(see {HINTS}, generate)"


def test_6f_generate_sampled_matches(student, model, vocab, ref_vocab, prompts, seed):
    """Sampled with seeds: the output always fully matches, and equals the reference's for the same seed."""
    rng = random.Random(seed + 66)
    for i, prompt in enumerate(prompts):
        for j, pattern in enumerate(rng.sample(GENERATION_REGEXES, 2)):
            sampling = SamplingParams(temperature=1.5, top_p=[1.0, 0.95][j], seed=seed + 10 * i + j)
            got = student.generate(model, prompt, student.RegexConstraint(pattern, vocab), MAX_NEW_TOKENS, sampling)
            check_output_matches(got, pattern, vocab, prompt, f"sampled ({sampling})")
            expected = reference.generate(model, prompt, reference.RegexConstraint(pattern, ref_vocab), MAX_NEW_TOKENS, sampling)
            problem = describe_token_mismatch(got, expected, VocabTokenizer(vocab), prompt)
            assert problem is None, f"sampled generation ({sampling}) under {pattern!r} differs from the reference's.\n{problem}\n(see {HINTS}, generate)"


# ----------------------------------------------------------------------------------------------
# Differential checks: generated toy vocabularies, choices and regexes; the reference and yours fed the same calls
# and compared after each (workshop/grading/differential.py): every mask exactly, the error class where one is raised.

# Byte pieces for toy vocabularies: ASCII tokens of one and more characters, "é" (c3 a9) and "☺" (e2 98 ba) whole and
# split across tokens, a byte that is never UTF-8 (ff).
TOY_POOL = [b"a", b"b", b"c", b"1", b"2", b" ", b"x", b"ab", b"abc", b"ba", b"12", b" a", b"a1", "é".encode(), b"\xc3",
            b"\xa9", "☺".encode(), b"\xe2", b"\x98", b"\xba", b"\xe2\x98", b"\x98\xba", b"\xff"]
CHOICE_ALPHABET = "abc12 xé☺"
# Regexes over that alphabet: alternation, classes, negated classes, counts, multi-byte characters, "." and a regex
# whose only match here may be the empty string; then regexes every side must refuse (ValueError).
TOY_REGEXES = [r"[ab]{1,3}", r"(ab|a)c?", r"[^a]{1,2}", r"[0-9]+ ?", r"(é|☺)a", r"[^é]é?", r"a|ab|abc", r".{1,2}", r"(xyz)?",
               r"1*", r"[a-c]{2}[^b]", r"(a|é)+1", r"[^\s\S]", r"(a)\1", r"[a-", r"x+"]
BAD_CHOICES = [([], "exact"), ([""], "exact"), (["a", ""], "exact"), ("ab", "refused"), (["a", 3], "refused"), ([b"a"], "refused"),
               ({"a": 1}, "refused")]


def hint(section):
    return f"Hint: see {HINTS}, {section}."


@st.composite
def toy_vocabularies(draw, spell=()):
    """2 to 14 distinct pieces of TOY_POOL in any order, with one or two special tokens (None) among them: EOS is one.
    Every byte of the strings in `spell` is a token too (as in GPT-2's vocabulary: any choice can be spelled)."""
    tokens = draw(st.lists(st.sampled_from(TOY_POOL), min_size=2, max_size=14, unique=True))
    for byte in sorted({b for text in spell for b in text.encode()}):
        if bytes([byte]) not in tokens:
            tokens.insert(draw(st.integers(0, len(tokens))), bytes([byte]))
    for _ in range(draw(st.integers(1, 2))):
        tokens.insert(draw(st.integers(0, len(tokens))), None)
    specials = [i for i, t in enumerate(tokens) if t is None]
    return tokens, draw(st.sampled_from(specials))


def observe_vocabulary(vocab):
    """What Vocabulary promises: every token's bytes, its UTF-8 split, the bytes -> id index, the size, the EOS id."""
    return record(vocab, "tokens", "texts", "index", "size", "eos_token_id")


def given_parts(mods, tokens, eos, rng):
    """utf8_split and Vocabulary (given code) on the scenario's pieces: the two sides' vocabularies, as Twins."""
    for piece in [t for t in tokens if t is not None] + [b"".join(rng.sample([t for t in tokens if t], 2)) if len(tokens) > 3 else b""]:
        mods.call(f"utf8_split({piece!r})", lambda m, p=piece: m.utf8_split(p))
    mods.call(f"Vocabulary({tokens}, eos_token_id=0) where token 0 may be no special token",
              lambda m: m.Vocabulary(tokens, eos_token_id=0), returns="type")
    vocab = mods.call(f"vocab = Vocabulary({tokens}, eos_token_id={eos})", lambda m: m.Vocabulary(tokens, eos_token_id=eos),
                      returns="type", observe=observe_vocabulary)
    ids = rng.sample(range(len(tokens)), rng.randint(0, len(tokens)))
    vocab.call(f"vocab.mask({ids})", lambda v: v.mask(ids))
    vocab.call(f"vocab.decode({ids})", lambda v: v.decode(ids))
    return vocab


def walk(constraints, vocab_size, eos, rng, steps):
    """The constraints (name, Twins of the two sides' constraint and vocabulary) walked interleaved, one step each in
    turn, along random paths of allowed tokens (back to start() at a dead end or by chance): in every state the mask
    (allowed, exactly), and now and then advance() with a token the mask forbids, EOS included (the reference's
    ValueError)."""
    paths = []
    for name, c in constraints:
        paths.append([name, c, c.call(f"{name}_state = {name}.start()", lambda obj: obj.start(), returns=None)])
    for _ in range(steps):
        for entry in paths:
            name, c, state = entry
            pair = Twins((c.reference, state.reference), (c.student, state.student), hint=c.hint, log=c.log)
            mask = pair.call(f"{name}.allowed({name}_state)", lambda side: side[0].allowed(side[1])).reference
            allowed = [i for i in range(vocab_size) if mask[i] and i != eos]
            forbidden = [i for i in range(vocab_size) if not mask[i]] + [eos]
            if rng.random() < 0.4:
                bad = rng.choice(forbidden)
                pair.call(f"{name}.advance({name}_state, {bad}) (a token the mask forbids)", lambda side: side[0].advance(side[1], bad))
            if allowed and rng.random() < 0.85:
                token = rng.choice(allowed)
                entry[2] = pair.call(f"{name}_state = {name}.advance({name}_state, {token})", lambda side: side[0].advance(side[1], token),
                                     returns=None)
            else:
                entry[2] = c.call(f"{name}_state = {name}.start()", lambda obj: obj.start(), returns=None)


def refused(make):
    """The reading of a call that must refuse its argument's type: TypeError and ValueError alike."""
    try:
        make()
    except (TypeError, ValueError):
        return "refused (TypeError or ValueError)"
    return "accepted"


@st.composite
def choice_scenarios(draw):
    """Two lists of choices (1 to 4 strings over CHOICE_ALPHABET, a prefix of another choice often, a tuple
    sometimes), a toy vocabulary that can spell them, a bad argument, and a random source for the walks."""
    def choices():
        found = draw(st.lists(st.text(CHOICE_ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4))
        if draw(st.booleans()):  # a choice that is a prefix of another: EOS and further tokens both allowed there
            longest = max(found, key=len)
            found.append(longest[:draw(st.integers(1, len(longest)))])
        return tuple(found) if draw(st.integers(0, 3)) == 0 else found
    first, second = choices(), choices()
    return (draw(toy_vocabularies(spell=[*first, *second])), first, second, draw(st.sampled_from(BAD_CHOICES)),
            draw(st.randoms(use_true_random=False)))


def test_differential_6e_choices(student, tokenizer, seed):
    """utf8_split, Vocabulary (from_tokenizer too, once) and two ChoiceConstraints over the same toy vocabulary, used
    interleaved, against the reference's: choices that are prefixes of each other, multi-byte characters split across
    tokens, special tokens beyond EOS, a tuple of choices; every state's mask exactly, advance() with forbidden tokens
    and EOS (ValueError), bad choices refused (an empty list or choice: ValueError; a bare string, a non-string:
    TypeError or ValueError)."""
    def check(scenario):
        (tokens, eos), first, second, (bad, how), rng = scenario
        mods = Twins(reference, student, hint=hint("ChoiceConstraint.allowed"))
        vocab = given_parts(mods, tokens, eos, rng)
        sides = Twins((reference, vocab.reference), (student, vocab.student), hint=hint("ChoiceConstraint.__init__"), log=mods.log)
        if how == "exact":
            sides.call(f"ChoiceConstraint({bad!r}, vocab)", lambda side: side[0].ChoiceConstraint(bad, side[1]), returns="type")
        else:
            sides.call(f"ChoiceConstraint({bad!r}, vocab)", lambda side: refused(lambda: side[0].ChoiceConstraint(bad, side[1])))
        made = [(name, sides.call(f"{name} = ChoiceConstraint({choices!r}, vocab)", lambda side, c=choices: side[0].ChoiceConstraint(c, side[1]),
                                  returns="type")) for name, choices in (("a", first), ("b", second))]
        for _, c in made:
            c.hint = hint("ChoiceConstraint.allowed and ChoiceConstraint.advance")
        walk(made, len(tokens), eos, rng, steps=6)

    # Vocabulary.from_tokenizer (given), once: GPT-2's every token's bytes, texts and index as the reference's
    Twins(reference, student, hint=hint("ChoiceConstraint.__init__")).call(
        "Vocabulary.from_tokenizer(tokenizer)", lambda m: m.Vocabulary.from_tokenizer(tokenizer), returns="type", observe=observe_vocabulary)
    explore(choice_scenarios(), check, seed=seed, examples=40, name="choices", edges=choice_edges())


def choice_edges():
    """Tried first at every seed (issue 41): EOS as id 0, a choice that is a prefix of another beside a tuple of one
    choice whose "é" is split across two tokens, the empty list refused; a one-token vocabulary and one choice beside a
    choice of that token twice, a bare string refused. (Made at each call: the walks consume their random source.)"""
    return [(([None, b"a", b"b", b"ab", b"\xc3", b"\xa9", None], 0), ["a", "ab"], ("é",), ([], "exact"), random.Random(0)),
            (([b"x", None], 1), ["x"], ["xx", "x"], ("ab", "refused"), random.Random(1))]


@st.composite
def generate_scenarios(draw, regexes):
    """A toy vocabulary and a small random model over it, a prompt, choices (or a regex, with regexes: 6f's), max_new_tokens
    from 1 to past the answer, greedy or sampled with a seed (a repetition penalty sometimes)."""
    if not regexes or draw(st.booleans()):
        constraint = ("choices", draw(st.lists(st.text(CHOICE_ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3)))
    else:
        constraint = ("regex", draw(st.sampled_from(TOY_REGEXES[:12])))
    tokens, eos = draw(toy_vocabularies(spell=constraint[1] if constraint[0] == "choices" else ()))
    config = draw(small_config(max_layers=2, n_positions=(16,), vocab_size=len(tokens)))
    prompt = draw(st.lists(st.integers(0, len(tokens) - 1), min_size=1, max_size=5))
    max_new = draw(around(1, 4, low=1, high=config.n_positions - len(prompt)))
    sampling = draw(st.sampled_from([GREEDY, SamplingParams(temperature=1.5, seed=1), SamplingParams(top_p=0.9, seed=2),
                                     SamplingParams(temperature=0.0, repetition_penalty=3.0), SamplingParams(temperature=0.8, repetition_penalty=2.0, seed=3)]))
    return tokens, eos, config, prompt, constraint, max_new, sampling


def test_differential_6e_generate(student, seed):
    """generate on small random models over toy vocabularies, under choices, against the reference: the new tokens
    (Python ints, EOS last or max_new_tokens of them) and the forward passes (none for a forced EOS), the prompt
    unchanged, the same tokens again for the same seed; a mask that allows nothing: an error on both sides."""
    check_generate(student, seed, regexes=False)


def test_differential_6f_generate(student, seed):
    """As test_differential_6e_generate, under choices and regexes (RegexConstraint is 6f's)."""
    check_generate(student, seed, regexes=True)


def check_generate(student, seed, regexes):
    def check(scenario):
        tokens, eos, config, prompt, (kind, spec), max_new, sampling = scenario
        m = small_model(config)
        ref_vocab = reference.Vocabulary(tokens, eos)
        try:
            reference.RegexConstraint(spec, ref_vocab) if kind == "regex" else reference.ChoiceConstraint(spec, ref_vocab)
        except ValueError:
            return  # the regex cannot start here: 6f grades that refusal
        try:
            reference.generate(m, prompt, reference.RegexConstraint(spec, ref_vocab) if kind == "regex" else reference.ChoiceConstraint(spec, ref_vocab), max_new, sampling)
            broken = False
        except RuntimeError:  # a state whose mask allows nothing: any error will do (the contract names none)
            broken = True

        def run(side, p):
            vocab = side.Vocabulary(tokens, eos)
            constraint = side.RegexConstraint(spec, vocab) if kind == "regex" else side.ChoiceConstraint(spec, vocab)
            with count_model_work(m) as work:
                try:
                    got = side.generate(m, p, constraint, max_new, sampling)
                except NotImplementedError:
                    raise
                except Exception:  # noqa: BLE001
                    if broken:
                        return "raised: a mask allowed nothing"
                    raise
            return {"new tokens": got, "forward passes": work.forward_passes}
        twins = Twins(reference, student, hint=hint("generate"))
        twins.call(f"generate(model with {config.n_layer} layers, {config.n_head} heads, width {config.n_embd} over the vocabulary "
                   f"{tokens} (EOS {eos}); prompt={prompt}, {'RegexConstraint' if kind == 'regex' else 'ChoiceConstraint'}({spec!r}, vocab), "
                   f"max_new_tokens={max_new}, sampling={sampling})", run, inputs=(prompt,), again=True)

    explore(generate_scenarios(regexes), check, seed=seed, examples=25, name="generate_with_regexes" if regexes else "generate",
            edges=GENERATE_EDGES + (REGEX_GENERATE_EDGES if regexes else []))


# Tried first at every seed (issue 41): EOS as id 0 in the prompt, a choice that is a prefix of another, one new token;
# one choice of one token sampled with a seed, max_new_tokens up to the context's end (EOS forced after it, no forward
# pass for it). With regexes: one whose only match is the empty string (EOS first).
_TOY = [None, b"a", b"b", b"ab"]
_TOY_CONFIG = GPTConfig(vocab_size=len(_TOY), n_positions=16, n_embd=8, n_layer=1, n_head=2)
GENERATE_EDGES = [
    (_TOY, 0, _TOY_CONFIG, [0], ("choices", ["ab", "a"]), 1, GREEDY),
    (_TOY, 0, _TOY_CONFIG, [1], ("choices", ["a"]), 15, SamplingParams(temperature=1.5, seed=1)),
]
REGEX_GENERATE_EDGES = [(_TOY, 0, _TOY_CONFIG, [2, 3], ("regex", r"(xyz)?"), 4, GREEDY)]


@st.composite
def regex_scenarios(draw):
    """A toy vocabulary, two regexes of TOY_REGEXES (the refused ones among them) and a random source for the walks."""
    return draw(toy_vocabularies()), draw(st.sampled_from(TOY_REGEXES)), draw(st.sampled_from(TOY_REGEXES)), draw(st.randoms(use_true_random=False))


def observe_dfa(dfa):
    return record(dfa, "initial", "accepting")


def test_differential_6f_regex(student, seed):
    """CharDFA (given) and two RegexConstraints over the same toy vocabulary, used interleaved, against the reference:
    alternation, classes and negated classes, "é" and "☺" split across tokens (bytes pending), a regex whose start
    allows only EOS, regexes to refuse (ValueError: matches nothing, no token can start it, not a DFA); every state's
    mask exactly, advance() with forbidden tokens and EOS (ValueError)."""
    def check(scenario):
        (tokens, eos), first, second, rng = scenario
        mods = Twins(reference, student, hint=hint("RegexConstraint.__init__"))
        vocab = given_parts(mods, tokens, eos, rng)
        dfa = mods.call(f"CharDFA({first!r})", lambda m: m.CharDFA(first), returns="type", observe=observe_dfa)
        if dfa is not None and dfa.reference.initial is not None:
            for char in "a1é☺ \n":
                dfa.call(f"dfa.step(dfa.initial, {char!r})", lambda d, ch=char: d.step(d.initial, ch))
            for unfinished in (b"\xc3", b"\xe2", b"\xe2\x98", b"\xf0\x9f"):
                dfa.call(f"dfa.can_continue(dfa.initial, {unfinished!r})", lambda d, u=unfinished: d.can_continue(d.initial, u))
        sides = Twins((reference, vocab.reference), (student, vocab.student), hint=hint("RegexConstraint.__init__"), log=mods.log)
        made = []
        for name, pattern in (("a", first), ("b", second)):
            c = sides.call(f"{name} = RegexConstraint({pattern!r}, vocab)", lambda side, p=pattern: side[0].RegexConstraint(p, side[1]), returns="type")
            if c is not None:  # None: both refused it, as they should
                c.hint = hint("RegexConstraint.allowed and RegexConstraint.advance")
                made.append((name, c))
        walk(made, len(tokens), eos, rng, steps=6)

    explore(regex_scenarios(), check, seed=seed, examples=40, name="regex", edges=regex_edges())


def regex_edges():
    """Tried first at every seed (issue 41): "é" split across two tokens, "☺" one token, beside a regex that matches nothing
    (refused); EOS as id 0, a regex whose one match these tokens can spell is the empty string ("x" starts a dead end)
    beside one that is no regex (refused)."""
    return [(([b"a", b"\xc3", b"\xa9", "☺".encode(), None, b"1"], 4), r"(é|☺)a", r"[^\s\S]", random.Random(0)),
            (([None, b"x", b"ab"], 0), r"(xyz)?", r"[a-", random.Random(1))]


# ----------------------------------------------------------------------------------------------
# Timing: the cache, and the cost of building masks

def path_through(constraint, texts, vocab):
    state = constraint.start()
    for text in texts:
        state = constraint.advance(state, vocab.index[text.encode()])
    return state


@pytest.mark.timing
def test_6f_cached_masks_are_free(student, vocab):
    """A state seen before (reached by another path) costs a lookup, not a walk over 50,257 tokens."""
    pattern = r"[a-z ]{0,12}\."
    constraint = student.RegexConstraint(pattern, vocab)
    build, lookup = [], []
    for first, second in [(["the"], ["t", "he"]), (["the", " king"], ["th", "e", " k", "ing"]), (["the", " king", " is"], ["th", "e", " king", " i", "s"])]:
        state, again = path_through(constraint, first, vocab), path_through(constraint, second, vocab)
        t0 = time.perf_counter()
        a = constraint.allowed(state)
        t1 = time.perf_counter()
        b = constraint.allowed(again)
        t2 = time.perf_counter()
        assert torch.equal(a, b), f"the texts {''.join(first)!r} and {''.join(second)!r} reach the same DFA state but got different masks."
        build.append(t1 - t0), lookup.append(t2 - t1)
    samples = ", ".join(f"{b * 1e3:.2f} ms then {c * 1e3:.3f} ms" for b, c in zip(build, lookup))
    assert sorted(lookup)[1] * 20 < sorted(build)[1], (
        f"the mask of a state seen before should come from the cache (a dict lookup), at least 20x faster than building it; "
        f"measured (first, again): {samples}. Key the cache by the whole state (see {HINTS}, RegexConstraint.allowed, hint 2).")


@pytest.mark.timing
def test_6f_speed_against_reference(student, tokenizer, vocab, ref_vocab, device):
    """Building the masks of a fresh constraint along a path: your time against the reference's."""
    pattern, text = r'\{"name": "[A-Za-z ]{1,12}", "age": [0-9]{1,2}\}', '{"name": "Romeo", "age": 17}'

    def build(module, v):
        constraint = module.RegexConstraint(pattern, v)
        state = constraint.start()
        for token in tokenizer.encode(text):
            constraint.allowed(state)
            state = constraint.advance(state, token)
    timing = paired_timing(lambda: build(student, vocab), lambda: build(reference, ref_vocab), repeats=3, device=device)
    assert timing.ratio < 3.0, f"building masks takes {timing.ratio:.2f}x the reference's time (limit 3x):\n{timing.report('yours', 'reference')}"
