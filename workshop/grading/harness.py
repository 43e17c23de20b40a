"""The grading harness: which implementation is under test, cost counters, paired timings and
failure messages that teach. Used by the checkers (test_ex*.py), the notebooks and timed_generate.py.

Which implementation: the student's exercises/ by default; `pytest exercises/ --impl solutions` or
the environment variable WORKSHOP_IMPL=solutions picks the reference solutions instead.
"""

import importlib
import os
import random
import re
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from workshop.grading import device_audit
from workshop.grading.wording import plural

IMPL_ENV = "WORKSHOP_IMPL"
IMPLS = ("exercises", "solutions")
# Module name -> dotted path of a replacement, for the negative controls in tests/ (pytest --replace).
REPLACEMENTS = {}


CHECK_PART = re.compile(r"test_(?:differential_)?(\d+[a-z]+)(?:_|$)")  # test_5a_..., test_differential_8b_..., test_differential_9bc_...


def part_of_check(name):
    """The part a check grades, as its name says ("test_differential_8b_symmetric" -> "8b"; "9bc", which grades the
    two together, -> "9c", the later one); "" for a check of the whole exercise."""
    match = CHECK_PART.match(name)
    if not match:
        return ""
    number = re.match(r"\d+", match[1])[0]
    return number + match[1][len(number):][-1]


def implementation(module, impl=None):
    """Import `module` (e.g. "ex2_kv_cache") from the implementation under test."""
    if module in REPLACEMENTS:
        return importlib.import_module(REPLACEMENTS[module])
    impl = impl or os.environ.get(IMPL_ENV, "exercises")
    if impl not in IMPLS:
        raise ValueError(f"{IMPL_ENV}={impl!r} is not an implementation: use one of {', '.join(IMPLS)}.")
    return importlib.import_module(f"{impl}.{module}")


def run_script(main, *more_errors):
    """Run a script's main() (timed_generate.py, bench/*.py): a bad model name or value, or an exercise
    not written yet, ends it with one line on stderr instead of a traceback."""
    import gpt

    try:
        main()
    except NotImplementedError as error:
        sys.exit(f"error: not implemented yet. {error}")
    except (gpt.ModelLoadError, ValueError, *more_errors) as error:
        sys.exit(f"error: {error}")


# ----------------------------------------------------------------------------------------------
# Deterministic cost counters

@dataclass
class WorkCount:
    tokens: int = 0  # token positions pushed through the model (padding included)
    forward_passes: int = 0
    projected_tokens: int = 0  # token positions through the layers' key/value projections (attn.c_attn), all layers


@contextmanager
def count_model_work(model):
    """Count the forward passes and token positions that go through `model` inside the block.

    Every path into a gpt.py model, with or without a KV cache, starts at the token embedding
    transformer.wte, so a hook there sees them all. A hook on each layer's attn.c_attn counts the
    positions whose keys and values are computed: a KV cache computes each position's once, however it
    stores them (a path that reads c_attn's weights without calling it is not counted).
    """
    count = WorkCount()

    def embedded(module, args, output):
        count.tokens += args[0].numel()
        count.forward_passes += 1

    def projected(module, args, output):
        count.projected_tokens += args[0].numel() // args[0].shape[-1]

    handles = [model.transformer.wte.register_forward_hook(embedded)]
    handles += [block.attn.c_attn.register_forward_hook(projected) for block in model.transformer.h]
    try:
        yield count
    finally:
        for handle in handles:
            handle.remove()


class _TorchOpCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and not getattr(func, "__name__", "") == "__get__":  # attributes launch nothing
            self.ops += 1
        return result


def count_torch_ops(fn):
    """How many torch operations that return a tensor fn() runs: about one kernel launch each on a GPU,
    whatever the tensors' sizes (views count too, and launch nothing: an upper bound)."""
    with _TorchOpCounter() as counter:
        fn()
    return counter.ops


# ----------------------------------------------------------------------------------------------
# Wall clock, only ever as a ratio measured in one process

def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass
class PairedTiming:
    seconds_a: list = field(default_factory=list)
    seconds_b: list = field(default_factory=list)

    @property
    def ratios(self):
        return [a / b for a, b in zip(self.seconds_a, self.seconds_b)]

    @property
    def ratio(self):
        """Median of the paired ratios time(a) / time(b): robust to a noisy neighbour."""
        return statistics.median(self.ratios)

    def report(self, name_a="a", name_b="b"):
        rows = [f"  run {i}: {name_a} {a * 1e3:8.1f} ms   {name_b} {b * 1e3:8.1f} ms   ratio {a / b:6.2f}"
                for i, (a, b) in enumerate(zip(self.seconds_a, self.seconds_b))]
        return "\n".join(rows + [f"  median ratio {name_a}/{name_b}: {self.ratio:.2f}"])


def paired_timing(fn_a, fn_b, repeats=5, warmup=1, device="cpu"):
    """Time fn_a against fn_b: warm both up, then alternate which one runs first over `repeats`
    rounds, so drifts in machine load hit both equally. Returns every sample and the median ratio."""
    for _ in range(warmup):
        fn_a(), fn_b()
    timing = PairedTiming()
    with device_audit.paused():  # the audit (if any) checked the warm-up; its Python costs would blur the timings
        _alternate(fn_a, fn_b, repeats, device, timing)
    return timing


def _alternate(fn_a, fn_b, repeats, device, timing):
    for i in range(repeats):
        pair = [(fn_a, timing.seconds_a), (fn_b, timing.seconds_b)]
        for fn, samples in pair if i % 2 == 0 else reversed(pair):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            samples.append(time.perf_counter() - start)


@contextmanager
def gpu_turn(lock_path, alone):
    """Share one GPU between processes (pytest-xdist's workers): any number of checks at once, but a check
    that times itself (`alone`) waits until the others have left the card, and keeps it to itself while it
    runs. CUDA time-slices the processes on a card, so a neighbour's kernels land inside a timed region and
    blur it (exercise 4's ratio: 0.81x with eight workers sharing an H200, above its 1.2x bound alone).
    A turnstile in front of the room gives the waiting timed check priority over new arrivals."""
    if os.name == "nt":  # no fcntl: the checks share the card as they come
        yield
        return
    import fcntl

    with open(f"{lock_path}.turnstile", "a") as turnstile, open(f"{lock_path}.room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------
# Statistics for samplers

def audited_first(runs, audited=10):
    """range(runs), with the device audit (if on) watching only the first `audited` of them. A statistical
    check repeats one code path hundreds or thousands of times: a device bug shows in the first runs, and the
    audit costs Python time on every torch op of every run. Consume it whole (no break): it pauses between yields."""
    for i in range(runs):
        if i < audited:
            yield i
        else:
            with device_audit.paused():
                yield i


def chi_square_p_value(counts, probs):
    """P(chi-square >= observed) for observed counts against probabilities (categories with p > 0):
    the goodness-of-fit test the sampling checkers use. Returns (p-value, statistic)."""
    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    df = len(probs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2)), float(stat)


# ----------------------------------------------------------------------------------------------
# Failure messages that teach

@contextmanager
def refused(error, what):
    """pytest.raises(error) that, when nothing is raised, says which input should have been refused: `what` is the
    call and the input that decides it ("beam_search with max_new_tokens=0")."""
    import pytest

    __tracebackhide__ = True
    names = " or ".join(e.__name__ for e in error) if isinstance(error, tuple) else error.__name__
    try:
        with pytest.raises(error) as info:
            yield info
    except pytest.fail.Exception:
        raise AssertionError(f"{what} should have been refused with {names}, but nothing was raised: check that input first "
                             f"and raise {names} with one clear sentence, before any work.") from None

def describe_token_mismatch(got, expected, tokenizer, prompt_ids=None):
    """None when equal; else a paragraph saying where the two token lists first differ."""
    if not isinstance(got, list) or not all(isinstance(t, int) for t in got):
        return f"expected a list of Python ints (token ids), got {type(got).__name__}: {str(got)[:200]}"
    if got == expected:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    lines = [f"{plural(len(got), 'token')} came back, {len(expected)} expected; first difference at new token {i}:"]
    if i < len(got) and i < len(expected):
        lines.append(f"  got {got[i]} ({tokenizer.decode([got[i]])!r}), expected {expected[i]} ({tokenizer.decode([expected[i]])!r})")
    elif i < len(expected):
        lines.append(f"  yours stopped early; expected to continue with {expected[i]} ({tokenizer.decode([expected[i]])!r})")
    else:
        lines.append(f"  yours went on after the expected end, with {got[i]} ({tokenizer.decode([got[i]])!r})")
    if prompt_ids is not None:
        lines.append(f"  prompt ({plural(len(prompt_ids), 'token')}): {tokenizer.decode(prompt_ids)[-120:]!r}")
    lines.append(f"  got text:      {tokenizer.decode(got)[:200]!r}")
    lines.append(f"  expected text: {tokenizer.decode(expected)[:200]!r}")
    return "\n".join(lines)


# Batched and single-row forwards, or a cached and an uncached one, add the same numbers in a different
# order, so float32 logits may differ in the last bits (about 1e-5 here). Greedy decoding notices only
# where the two best tokens are nearly tied: a flip is tolerated there and nowhere else, namely where the
# reference's logit of its own token exceeds that of the token that came back by less than tie_epsilon(model).
# In half precision the same reorderings move the logits far more: measured with the tiny model (logits ~10-15), up to
# 0.0078 in float16 and 0.0625 in bfloat16 (one step of its 8-bit mantissa at 8-16); see differential.TOLERANCES.
TIE_EPSILON = 1e-3  # logits, float32; ~100x the float32 difference between batched and single-row forwards
# A flip needs the two sides' rounding errors to add up past the gap (at most twice the largest difference measured);
# the half types' margins are twice that again. Not 10x: these random models' two best logits are only ~0.2 apart
# (median), so a wider margin would call most of their tokens near ties and compare almost nothing.
TIE_EPSILONS = {
    torch.float32: TIE_EPSILON,
    torch.float16: 0.03,  # 4x the 0.0078 measured
    torch.bfloat16: 0.25,  # 4x the 0.0625 measured (one bfloat16 step at 8-16): four steps
}


def tie_epsilon(model_or_dtype):
    """The near-tie margin (logits) for a model, or a dtype: TIE_EPSILONS's, float32's for any other dtype."""
    dtype = model_or_dtype if isinstance(model_or_dtype, torch.dtype) else next(model_or_dtype.parameters()).dtype
    return TIE_EPSILONS.get(dtype, TIE_EPSILON)


@torch.no_grad()
def logit_gap(model, prefix, preferred, other):
    """How much the model's logit for `preferred` exceeds that for `other` after `prefix`: one full forward in the
    model's own dtype (where the reference made its choice), the two logits cast to float32 before the subtraction (a
    difference taken in half precision would round it once more)."""
    ids = torch.tensor([prefix], device=model.device)
    logits = model(ids, torch.arange(len(prefix), device=model.device)[None])[0, -1].float()
    return (logits[preferred] - logits[other]).item()


def compare_tokens(got, expected, model, prompt_ids, tokenizer):
    """None when `got` equals `expected` (greedy new tokens after prompt_ids), or differs only from a near
    tie on (see tie_epsilon); else a paragraph saying where and how it differs."""
    problem = describe_token_mismatch(got, expected, tokenizer, prompt_ids)
    if problem is None:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    if i is None:
        return problem  # same tokens, wrong length: stopping is wrong, no rounding explains that
    gap = logit_gap(model, list(prompt_ids) + expected[:i], expected[i], got[i]) if 0 <= got[i] < model.config.vocab_size else float("inf")
    if gap < tie_epsilon(model):
        return None  # a near tie that float rounding may flip: what follows it cannot be compared
    return (f"{problem}\n  The reference prefers its token over yours by {gap:.3g} logits; a flip is tolerated only "
            f"where that margin is below {tie_epsilon(model)} (float rounding), so this is a real difference.")


def transformers_greedy(hf_model, prompt_ids, max_new_tokens, eos_token_id):
    """The new tokens of transformers' own greedy `generate`, the outside reference for exercises 1-2."""
    input_ids = torch.tensor([prompt_ids], device=hf_model.device)
    out = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                            min_new_tokens=0, do_sample=False, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return out[0, len(prompt_ids):].tolist()


# ----------------------------------------------------------------------------------------------
# Checks shared by the generate() checkers of exercises 1 and 2

def assert_generates_like(generate, expected, model, tokenizer, cases, against, hint=""):
    """For every (prompt, n) of `cases`, generate(model, prompt, n) must return expected(prompt, n), up
    to a near-tie flip (see tie_epsilon)."""
    for prompt, n in cases:
        problem = compare_tokens(generate(model, prompt, n), expected(prompt, n), model, prompt, tokenizer)
        assert problem is None, f"generate(max_new_tokens={n}) differs from {against}.\n{problem}\n{hint}"


def assert_eos_in_prompt_is_text(generate, reference_generate, model, tokenizer, cases, eos_token_id, hint):
    """An EOS id inside the prompt (documents joined by <|endoftext|>, or GPT-2's pad id) is text like any
    other token: for every (prompt, n) of `cases` that holds one, generation neither stops on it nor leaves
    it out of the model's input, so it returns what the reference returns (up to a near tie)."""
    for prompt, n in cases:
        if eos_token_id not in prompt:
            continue
        problem = compare_tokens(generate(model, prompt, n), reference_generate(model, prompt, n), model, prompt, tokenizer)
        assert problem is None, (f"the prompt holds eos_token_id={eos_token_id} ({tokenizer.decode([eos_token_id])!r}) at position "
                                 f"{prompt.index(eos_token_id)}: there it is text like any other token, so it must neither stop "
                                 f"generation nor be left out of (or hidden from) the model's input.\n{problem}\n"
                                 f"Hint: only a token the model produces stops generation ({hint}).")


def assert_stops_right_after_eos(generate, reference_generate, model, tokenizer, prompts, seed, hint_token, hint_work):
    """Pretend a token the model will produce is the EOS (if it can, one the prompt contains too): generation
    returns it as its last token and runs no forward pass after it (the EOS is part of the output, as in
    transformers). hint_token, hint_work: where the hints for a wrong output and for wasted work are."""
    rng = random.Random(seed)
    for prompt in prompts:
        free_run = reference_generate(model, prompt, 20, eos_token_id=-1)
        in_prompt = [j for j in range(19) if free_run[j] in prompt and free_run.index(free_run[j]) == j]
        eos = free_run[rng.choice(in_prompt or range(19))]
        expected = free_run[: free_run.index(eos) + 1]
        with count_model_work(model) as work:
            got = generate(model, prompt, 20, eos_token_id=eos)
        where = " (it occurs in the prompt too: only the model's token stops)" if eos in prompt else ""
        problem = compare_tokens(got, expected, model, prompt, tokenizer)
        assert problem is None, (f"with eos_token_id={eos} ({tokenizer.decode([eos])!r}){where}, generation should stop right "
                                 f"after the model produces it.\n{problem}\n({hint_token})")
        assert work.forward_passes == len(got), (
            f"with eos_token_id={eos} ({tokenizer.decode([eos])!r}) you returned {plural(len(got), 'token')} but ran {work.forward_passes} "
            f"forward passes: every forward pass after the EOS is wasted work. Stop as soon as the EOS is recorded ({hint_work}).")
