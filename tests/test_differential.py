"""Every public name of every stub is graded differentially: each checker declares, in DIFFERENTIAL_API, which of
its checks calls each public function, class and method of its stub through workshop.grading.differential.Twins
(the same calls on the reference and the student's code, compared after every call, with the generic properties:
error class, inputs unchanged, no shared storage, the reference's types, the same result twice). This keeps the
declaration and the stub in step: a new public name needs a differential check, and a named check must exist."""

import importlib
import re
from pathlib import Path

import pytest

from workshop.grading.differential import public_api

ROOT = Path(__file__).resolve().parents[1]
CHECKERS = sorted(p.stem for p in (ROOT / "exercises").glob("test_ex*.py"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # the checkers' marks live in exercises/conftest.py
@pytest.mark.parametrize("checker", CHECKERS)
def test_every_public_name_has_a_differential_check(checker):
    exercise = checker.removeprefix("test_")
    stub = importlib.import_module(f"exercises.{exercise}")
    source = (ROOT / "exercises" / f"{checker}.py").read_text()
    declared = getattr(importlib.import_module(f"exercises.{checker}"), "DIFFERENTIAL_API", None)
    assert declared is not None, f"exercises/{checker}.py declares no DIFFERENTIAL_API (public name -> the check that calls it)"
    missing = sorted(public_api(stub) - set(declared))
    assert not missing, f"exercises/{checker}.py's DIFFERENTIAL_API leaves out public names of the stub: {missing}"
    tests = set(re.findall(r"^def (test_\w+)", source, re.M))
    unknown = {name: check for name, check in declared.items() if check not in tests}
    assert not unknown, f"DIFFERENTIAL_API names checks exercises/{checker}.py does not have: {unknown}"
    for name, check in declared.items():
        body = source.split(f"def {check}(", 1)[1].split("\ndef ", 1)[0]
        assert "explore(" in body or "Twins(" in body or "differential" in check, (
            f"{check} (declared for {name}) does not run generated scenarios through Twins")


# ----------------------------------------------------------------------------------------------
# The harness refuses a scenario that leaves the contract (issue 40): on CUDA it would be a dead process

class _Side:
    """A stand-in for one side of Twins: counts the calls it gets."""

    def __init__(self):
        self.calls = 0

    def index(self, n):
        self.calls += 1
        import torch

        return torch.zeros(3).index_select(0, torch.tensor([n])).tolist()  # n = 3: IndexError from inside torch

    def library(self, n):
        self.calls += 1
        return int("not a number") + n  # ValueError, but from a builtin, not a raise of the contract


def test_a_reference_error_the_contract_names_is_compared():
    import gpt
    from workshop.grading.differential import Twins

    twins = Twins(gpt, gpt)  # check_request's ValueError: a raise in gpt.py, named by every generate's contract
    assert twins.call("check_request([], 1, 10)", lambda side: side.check_request([], 1, 10)) is None  # both raised: agreed


@pytest.mark.parametrize("call", ["index", "library"])
def test_a_reference_error_from_inside_torch_or_a_library_fails_the_check_as_the_harness_s(call):
    from workshop.grading.differential import OutsideTheContract, Twins

    twins = Twins(_Side(), _Side())
    with pytest.raises(OutsideTheContract, match="defect of this checker, not of the code under test") as failure:
        twins.call(f"{call}(3)", lambda side: getattr(side, call)(3))
    assert twins.student.calls == 0, "the student's side was called after the reference left the contract"
    assert "an error its contract does not name" in str(failure.value)


def test_a_result_still_tied_to_autograd_is_seen():
    """Issue 41: a value comparison misses a tensor or module still tied to the caller's parameters (a clone()
    without detach(): copy.deepcopy of the layer raises). The reading has requires_grad; a returned module must copy."""
    import torch

    from workshop.grading.differential import Divergence, Twins

    weight = torch.nn.Parameter(torch.ones(2, 2))

    class Side:
        def __init__(self, detach):
            self.detach = detach

        def scaled(self):
            return (weight.detach() if self.detach else weight) * 2

        def layer(self):
            module = torch.nn.Module()
            module.register_buffer("w", weight.detach().clone() if self.detach else weight.clone())
            return module

    with pytest.raises(Divergence, match="requires_grad"):
        Twins(Side(True), Side(False)).call("scaled()", lambda side: side.scaled())
    with pytest.raises(Divergence, match="deepcopy"):
        Twins(Side(True), Side(False)).call("layer()", lambda side: side.layer(), returns="type")
    Twins(Side(True), Side(True)).call("layer()", lambda side: side.layer(), returns="type")
