"""Differential grading: the reference is the oracle.

hypothesis draws scenarios biased to a contract's edges (workshop/grading/scenarios.py); the reference and the
student's implementation get the same calls; after every call an observer reads what the contract promises from
both, and the two readings must agree. A failure is shrunk by hypothesis to its smallest scenario and reported as
the first divergence: the calls that led there, what the reference gave, what came back, and the hint that helps.

    explore(strategy, check, seed=..., examples=...)   runs check(scenario) on generated scenarios, replayable from --seed
    Twins(reference, student, observe=...)             the two sides fed the same calls: twins.call("what", fn, inputs=...)
    read(value)                                        the plain reading of a value (tensors, containers, dataclasses)
    first_difference(expected, got)                    where two readings part, or None

The reference may raise only what its contract names (named_by_the_contract: a `raise` of the project's own code);
anything else (a TypeError from a library, an IndexError from inside torch) fails the check as OutsideTheContract,
a defect of the checker's scenario, and no later call is made. Every call through Twins also proves the generic
properties of issue 34: the error class is the reference's, the
inputs are unchanged unless the contract says otherwise (`mutates=`), an output shares no storage with an input,
and the returned value has the reference's type (a tensor: its dtype, device and requires_grad too); `again=True` calls
once more with fresh copies (the same result from the same arguments and seed). The model-level scenarios draw the
model's dtype (scenarios.dtypes: float32, float16, bfloat16) and compare within tolerance(dtype) (TOLERANCES).
The observer reads only what the stub promises, never one design's internals.
"""

import copy
import dataclasses
import math
import os
import traceback
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine as _engine
from hypothesis.internal.conjecture import providers as _providers

from workshop.grading.wording import plural

EXAMPLES_ENV = "WORKSHOP_EXAMPLES"  # a factor on every check's number of examples (pytest --examples sets it)
# A failing student's check shrinks its scenario for at most this long: the per-test timeout must still leave time.
_engine.MAX_SHRINKING_SECONDS = 30
_hypothesis_report = _engine.report


def _report(text):
    """hypothesis' own words, but where it gives up shrinking: its message says five minutes (its own limit) and asks
    for a bug report; here the limit is ours, and the scenario shown is simply the smallest found in that time."""
    if "working to shrink" in str(text):
        text = (f"(hypothesis stopped shrinking after {_engine.MAX_SHRINKING_SECONDS} s, this checker's limit: the scenario "
                f"reported is the smallest it found in that time, not necessarily the smallest there is.)")
    _hypothesis_report(text)


_engine.report = _report
# hypothesis also draws literals it finds in the local modules imported (the student's file among them): the same
# --seed would then give a student and the reference's seed sweep different scenarios. Off: a seed is a scenario list.
if hasattr(_providers, "_get_local_constants"):
    _providers._get_local_constants = lambda: _providers._local_constants


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How close two floats must be: |a - b| <= atol + rtol * |b| (the reference's value b)."""
    rtol: float = 1e-5
    atol: float = 1e-6


EXACT = Tolerance(0.0, 0.0)

# How close a model's outputs must be, per dtype, where a correct implementation adds the same numbers in another
# order (a batched, padded, cached or chunked forward against the reference's). Measured with the tiny model (logits
# ~10-15 in size): the largest |logit difference| between a batched or shorter-prefix forward and the full single-row
# forward, over 20 random prompts, was 1.1e-5 in float32, 0.0078 in float16 and 0.0625 in bfloat16 (its 8-bit mantissa:
# one step at 8-16 is 0.0625). The half types' bounds are about 10x those (2-3 steps of rounding at logit ~10).
# A check with its own float32 tolerance keeps it; tolerance() widens it to the dtype's.
TOLERANCES = {
    torch.float32: Tolerance(1e-5, 1e-6),
    torch.float16: Tolerance(rtol=1e-2, atol=1e-2),  # ~0.1 at logit 10: 10x the 0.0078 measured
    torch.bfloat16: Tolerance(rtol=5e-2, atol=5e-2),  # ~0.5 at logit 10: 8x the 0.0625 measured
}


def tolerance(dtype, tol=None):
    """The tolerance for a model's outputs in `dtype`: a check's own float32 tolerance `tol` (default TOLERANCES's),
    widened to at least the dtype's."""
    floor = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    tol = tol or floor
    return Tolerance(max(tol.rtol, floor.rtol), max(tol.atol, floor.atol))


class Divergence(AssertionError):
    """The student's side and the reference's parted: the message says where, after which calls."""


class OutsideTheContract(AssertionError):
    """The checker's scenario left the contract: the reference raised an error its contract does not name (a
    TypeError from a library, an IndexError or RuntimeError from inside torch). A defect of the checker, not of the
    code under test; on CUDA such a call can end the process (a device-side assert), so nothing more is called."""


ROOT = Path(__file__).resolve().parents[2]
# Where the errors a contract names are raised: the references, the stubs' given code, the shared library, gpt.py.
# Not the grading tools (the device audit's errors stand for what CUDA would do), nor torch or another library.
_CONTRACT_CODE = [ROOT / "solutions", ROOT / "exercises", ROOT / "workshop", ROOT / "gpt.py"]
_NOT_CONTRACT_CODE = [ROOT / "workshop" / "grading"]


def named_by_the_contract(error):
    """Whether `error` is one a contract names: raised by a `raise` statement of the project's own code (a
    reference's check, given code), not from inside torch or a library, nor by a slip of the reference (an
    IndexError from a list, a failed assert)."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    path = Path(frame.filename).resolve()
    inside = lambda folders: any(path == f or f in path.parents for f in folders)  # noqa: E731
    return (inside(_CONTRACT_CODE) and not inside(_NOT_CONTRACT_CODE) and not isinstance(error, AssertionError)
            and (frame.line or "").lstrip().startswith("raise"))


SCENARIOS_TRIED = [0]  # scenarios checked in this process (explicit edges, generated, shrinking): the run's summary says so


def explore(strategy, check, *, seed, examples, name="scenario", edges=()):
    """Run check(scenario) on every scenario of `edges` first (the contract's named edges: tried at every seed,
    whatever it draws), then on `examples` scenarios drawn from `strategy` (times --examples), the same ones for
    the same --seed; a failure is shrunk to the smallest scenario that still fails and re-raised."""
    examples = max(1, round(examples * float(os.environ.get(EXAMPLES_ENV, "1"))))

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False, print_blob=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False)
    @given(strategy)
    def run(scenario):
        SCENARIOS_TRIED[0] += 1
        check(scenario)

    for edge in reversed(edges):  # hypothesis runs explicit examples first, in the order written
        run = example(edge)(run)
    run.__name__ = run.__qualname__ = name
    try:
        run()
    except (Divergence, OutsideTheContract) as failure:  # hypothesis adds "Falsifying example" as a note: the message shows it
        failure.__notes__ = []
        raise


# ----------------------------------------------------------------------------------------------
# Readings: what an observer returns, compared field by field

@dataclasses.dataclass(frozen=True)
class TensorReading:
    dtype: str
    shape: tuple
    values: torch.Tensor  # a CPU copy
    device: str = "cpu"  # the device's type: a result must live where the reference's does
    requires_grad: bool = False  # a result still tied to autograd (a clone() of a parameter without detach())

    def __repr__(self):
        values = self.values.flatten()
        shown = values[:8].tolist()
        extra = (f", device={self.device}" if self.device != "cpu" else "") + (", requires_grad=True" if self.requires_grad else "")
        return f"tensor(dtype={self.dtype}, shape={list(self.shape)}{extra}, values={shown}{' ...' if values.numel() > 8 else ''})"


def read(value):
    """The plain reading of a value: tensors as (dtype, shape, CPU values), containers element by element with
    their type, dataclasses as their public fields, anything else as is (compared with ==)."""
    if isinstance(value, GreedyTokens):
        return value
    if isinstance(value, torch.nn.Module):  # an argument: a fingerprint of its weights, to see a change to them
        return Record(type(value).__name__, {name: (tuple(p.shape), float(p.detach().double().sum()))
                                             for name, p in value.state_dict(keep_vars=True).items()})
    if isinstance(value, torch.Tensor):
        return TensorReading(str(value.dtype).removeprefix("torch."), tuple(value.shape), value.detach().to("cpu", copy=True),
                             value.device.type, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(read(v) for v in value) if type(value) in (list, tuple) else [read(v) for v in value]
    if isinstance(value, dict):
        return {k: read(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Record(type(value).__name__, {f.name: read(getattr(value, f.name)) for f in dataclasses.fields(value)
                                             if not f.name.startswith("_")})
    return value


@dataclasses.dataclass(frozen=True)
class Record:
    """An object read as its class name and chosen fields (a class of the student's module and the reference's
    class of the same name compare equal when their fields do)."""
    kind: str
    fields: dict

    def __repr__(self):
        return f"{self.kind}({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


def record(obj, *names):
    """read() of the named attributes of obj, under its class's name: what an observer returns for an object."""
    return Record(type(obj).__name__, {name: read(getattr(obj, name)) for name in names})


@dataclasses.dataclass(frozen=True, eq=False)
class GreedyTokens:
    """Greedy tokens after `prefix`: equal to the reference's, or parted only where the model's two best logits are
    within harness.tie_epsilon(the model's dtype) (float rounding of a batched or cached forward may flip such a near tie)."""
    tokens: list
    model: object
    prefix: tuple

    def __repr__(self):
        return repr(self.tokens)


def _greedy_difference(expected, got, path):
    from workshop.grading.harness import logit_gap, tie_epsilon

    if not isinstance(got, GreedyTokens) or not isinstance(got.tokens, list) or not all(type(t) is int for t in got.tokens):
        return path, expected, got, "a list of Python ints (token ids)"
    e, g = expected.tokens, got.tokens
    i = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None)
    if i is None:
        return None if len(e) == len(g) else (path, e, g, f"{plural(len(e), 'token')} in the reference's, {len(g)} in yours")
    if 0 <= g[i] < expected.model.config.vocab_size and logit_gap(expected.model, list(expected.prefix) + e[:i], e[i], g[i]) < tie_epsilon(expected.model):
        return None  # a near tie float rounding may flip: what follows cannot be compared
    return f"{path}[{i}]", e, g, f"token {i}: the reference's {e[i]}, yours {g[i]}, and not at a near tie"


def type_name(value):
    return type(value).__name__


def first_difference(expected, got, tol=Tolerance(), path=""):
    """None when `got` reads as `expected`; else (path, expected part, got part, why)."""
    if isinstance(expected, GreedyTokens):
        return _greedy_difference(expected, got, path)
    if isinstance(expected, TensorReading) or isinstance(got, TensorReading):
        if not (isinstance(expected, TensorReading) and isinstance(got, TensorReading)):
            return path, expected, got, "a tensor on one side only"
        if (expected.dtype, expected.shape) != (got.dtype, got.shape):
            return path, expected, got, "dtype or shape"
        if expected.device != got.device:
            return path, expected, got, f"device: the reference's tensor is on {expected.device}, yours on {got.device}"
        if expected.requires_grad != got.requires_grad:
            return path, expected, got, ("requires_grad: yours is still tied to autograd (detach() what you copy from a "
                                         "parameter)" if got.requires_grad else "requires_grad")
        e, g = expected.values, got.values
        if e.is_floating_point():
            close = torch.isclose(g.double(), e.double(), rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        else:
            close = g == e
        if not bool(close.all()):
            where = tuple(int(i) for i in (~close).nonzero()[0])
            return f"{path}[{', '.join(map(str, where))}]", e[where].item(), g[where].item(), "value"
        return None
    if type(expected) is not type(got) and not (isinstance(expected, float) and type(got) is float):
        if not (isinstance(expected, Record) and isinstance(got, Record)):
            return path, expected, got, f"type: the reference's is {type_name(expected)}, yours {type_name(got)}"
    if isinstance(expected, Record):
        if expected.kind != got.kind:
            return path, expected.kind, got.kind, "class"
        return first_difference(expected.fields, got.fields, tol, path)
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(got):
            return path, expected, got, f"length {len(expected)} in the reference's, {len(got)} in yours"
        for i, (e, g) in enumerate(zip(expected, got)):
            found = first_difference(e, g, tol, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(expected, dict):
        if list(expected) != list(got):
            return path, list(expected), list(got), "keys (or their order)"
        for k in expected:
            found = first_difference(expected[k], got[k], tol, f"{path}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(expected, float):
        if math.isnan(expected) and math.isnan(got):
            return None
        if math.isinf(expected) or math.isinf(got):
            return None if expected == got else (path, expected, got, "value")
        return None if abs(got - expected) <= tol.atol + tol.rtol * abs(expected) else (path, expected, got, "value")
    return None if expected == got else (path, expected, got, "value")


def _where(filename):
    """A file's path from the repository's root, where it is inside it (shorter, and the same on every machine)."""
    path = Path(filename).resolve()
    return str(path.relative_to(ROOT)) if ROOT in path.parents else filename


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _differing_fields(expected, got, tol, names):
    """The fields that differ, each in full on both sides (the equal ones left out): what decides the failure."""
    fields = lambda v: v.fields if isinstance(v, Record) else v if isinstance(v, dict) else None  # noqa: E731
    e_fields, g_fields = fields(expected), fields(got)
    if e_fields is None or g_fields is None or list(e_fields) != list(g_fields):
        return f"\n  in full, {names[0]}: {_short(expected, 1200)}\n  in full, {names[1]}: {_short(got, 1200)}"
    differing = [k for k in e_fields if first_difference(e_fields[k], g_fields[k], tol)]
    same = len(e_fields) - len(differing)
    lines = [f"\n  {k!s}, {name}: {_short(side[k], 1200)}" for k in differing for name, side in zip(names, (e_fields, g_fields))]
    return "".join(lines) + (f"\n  ({plural(same, 'other field')} {'is' if same == 1 else 'are'} equal)" if same else "")


def _short(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


# ----------------------------------------------------------------------------------------------
# Twins: the two sides, the same calls

def _tensors(value, seen=None):
    """Every tensor reachable from value through containers and public attributes (for storage checks)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [t for v in value for t in _tensors(v, seen)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, seen)]
    if isinstance(value, torch.nn.Module):
        return list(value.parameters()) + list(value.buffers())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name), seen)]
    return []


def _modules(value):
    """The modules in a returned value: itself, or in a list, tuple or dict (one level down)."""
    if isinstance(value, torch.nn.Module):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return [v for v in items if isinstance(v, torch.nn.Module)]


def _storage(t):
    return t.untyped_storage().data_ptr() if t.numel() and t.untyped_storage().nbytes() else None


def _copy(value):
    """A fresh, independent copy of a call's input (tensors cloned, containers rebuilt; modules shared)."""
    if isinstance(value, torch.nn.Module):
        return value  # a model is shared by design; a change to it is caught by the snapshot below
    return copy.deepcopy(value)


class Twins:
    """The reference's side and the student's, fed the same calls; every call is logged, and a divergence
    reports the log. `observe(side)` reads the state the contract promises; it runs after every call."""

    def __init__(self, reference, student, observe=None, *, hint="", tol=Tolerance(), log=None):
        self.reference, self.student = reference, student
        self.observe, self.hint, self.tol = observe, hint, tol
        self.log = [] if log is None else log

    def call(self, what, fn, *, inputs=(), mutates=(), again=False, returns="same", observe=None, tol=None):
        """Apply fn(side, *inputs) to both sides, each with its own copy of `inputs`, and compare:
        the exception class (if the reference raises), the returned value's reading (returns="same"; "type" for its
        type only; None to skip), the inputs afterwards (unchanged, or as the reference's for the indices in
        `mutates`), no storage shared between the output and the inputs, then the observed state of both sides.
        Returns Twins of the two results (observed by `observe`, if given), so that calls chain."""
        self.log.append(what)
        tol = tol or self.tol
        ref_inputs, stu_inputs = [_copy(x) for x in inputs], [_copy(x) for x in inputs]
        before = read(inputs)
        error = None
        try:
            ref_out = fn(self.reference, *ref_inputs)
        except Exception as e:  # noqa: BLE001 - the reference's error is part of the contract
            error = e
        if error is not None and not named_by_the_contract(error):
            self._outside_the_contract(error)
        if error is not None:
            try:
                fn(self.student, *stu_inputs)
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ != type(error).__name__ and not isinstance(e, type(error)):
                    if isinstance(e, NotImplementedError):
                        raise
                    self._fail(f"the reference raises {type(error).__name__} here ({error}); yours raised "
                               f"{type(e).__name__} ({e})")
                self.log[-1] += f"  -> refused by both: {type(error).__name__}: {_first_line(error)}"
                return None
            self._fail(f"the reference raises {type(error).__name__} here ({error}); yours raised nothing")
        try:
            stu_out = fn(self.student, *stu_inputs)
        except NotImplementedError:
            raise  # a TODO not written yet: reported as such
        except Exception as e:  # noqa: BLE001 - where the reference returned: the calls that led here, and where it was raised
            frame = traceback.extract_tb(e.__traceback__)[-1]
            self._fail(f"yours raised {type(e).__name__}: {e}\n  (at {_where(frame.filename)}:{frame.lineno}, in {frame.name}: "
                       f"{frame.line}) where the reference returned {_short(read(ref_out))}")
        if returns == "same":
            self._compare(read(ref_out), read(stu_out), "the value returned", tol)
        elif returns == "type":
            self._compare(type_name(ref_out), type_name(stu_out), "the type of the value returned", tol)
        for i, (ref_in, stu_in) in enumerate(zip(ref_inputs, stu_inputs)):
            if i in mutates:
                self._compare(read(ref_in), read(stu_in), f"argument {i + 1} after the call (changed in place, as the contract says)", tol)
            else:
                self._compare(before[i], read(stu_in), f"argument {i + 1} after the call (the contract leaves it unchanged)", EXACT)
        inputs_storage = {_storage(t) for x, i in zip(stu_inputs, range(len(stu_inputs))) if i not in mutates
                          for t in _tensors(x) if not isinstance(x, torch.nn.Module)} - {None}
        shared = [t for t in _tensors(stu_out) if _storage(t) in inputs_storage]
        if shared:
            self._fail("the value returned shares storage with an argument: a caller that changes one changes the other. "
                       "Return new tensors (e.g. .clone()) where the contract returns a result.")
        for module in _modules(stu_out):  # a module handed back must stand alone: copyable, no tie to the caller's parameters
            try:
                copy.deepcopy(module)
            except Exception as e:  # noqa: BLE001
                self._fail(f"copy.deepcopy of the {type(module).__name__} returned raises {type(e).__name__} ({e}): a buffer "
                           f"or parameter of it is still tied to autograd (a clone() without detach()?). Store plain tensors.")
        if again:
            again_out = fn(self.student, *[_copy(x) for x in inputs])
            self._compare(read(stu_out), read(again_out), "a second call with the same arguments (and seed)", tol,
                          names=("your first call", "your second"))
        if self.observe is not None:
            self._compare(self.observe(self.reference), self.observe(self.student), "the state", tol)
        return Twins(ref_out, stu_out, observe, hint=self.hint, tol=self.tol, log=self.log)

    def check(self, what="the state"):
        """Compare the observed state of both sides now (e.g. after a call made through another Twins)."""
        self._compare(self.observe(self.reference), self.observe(self.student), what, self.tol)

    def _compare(self, expected, got, what, tol, names=("the reference", "yours")):
        found = first_difference(expected, got, tol)
        if found:
            path, e, g, why = found
            self._fail(f"{what} differs at {path or 'the top'} ({why}):\n  {names[0]}: {_short(e)}\n  {names[1]}: {_short(g)}"
                       + (_differing_fields(expected, got, tol, names) if path else ""))

    def _outside_the_contract(self, error):
        frame = traceback.extract_tb(error.__traceback__)[-1]
        calls = "\n".join(f"  {i + 1}. {c}" for i, c in enumerate(self.log))
        raise OutsideTheContract(
            f"A defect of this checker, not of the code under test: its scenario left the contract. At call "
            f"{len(self.log)} the reference raised {type(error).__name__}: {error}\n  (at {frame.filename}:{frame.lineno}, in "
            f"{frame.name}: {frame.line}), an error its contract does not name. On CUDA an error inside a kernel can "
            f"end the process, so nothing more is called. The calls:\n{calls}") from error

    def _fail(self, message):
        calls = "\n".join(f"  {i + 1}. {c}" for i, c in enumerate(self.log))
        raise Divergence(f"The smallest scenario hypothesis found where yours and the reference part (replay it with the "
                         f"same --seed):\n{calls}\nafter call {len(self.log)}, {message}" + (f"\n{self.hint}" if self.hint else ""))


def public_api(module):
    """The names a stub promises: its public functions and classes, and each class's public methods ("Class.method"),
    those defined in the module itself (not imported)."""
    import inspect

    names = set()
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__ or not callable(obj):
            continue
        names.add(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            names |= {f"{name}.{m}" for m, fn in vars(obj).items()
                      if not m.startswith("_") and (inspect.isfunction(fn) or isinstance(fn, (property, staticmethod, classmethod)))}
    return names
