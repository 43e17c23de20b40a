"""A failure's report fits on one screen with every input that decides it (issue 42): no pytest or pluggy frames,
the function to look at and its hint command, a call both sides refused marked with the error, the fields that
differ in full, a missing error naming the input that should have been refused, one cause told in full once, and
counts that read as English. The checker runs below grade planted mistakes (tests/controls/) with --replace."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis.reporting import with_reporter

import gpt
from workshop.grading import differential
from workshop.grading.differential import Divergence, Twins
from workshop.grading.harness import refused
from workshop.grading.wording import ordinal, plural

ROOT = Path(__file__).resolve().parents[1]
SCREEN = 40  # lines: a failure report, its score table and pytest's own summary lines together


def test_counts_read_as_english():
    assert [plural(n, "token") for n in (0, 1, 2)] == ["0 tokens", "1 token", "2 tokens"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 102, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "102nd", "111th"]


def test_hypothesis_gives_up_shrinking_in_a_true_sentence():
    """hypothesis' own text says five minutes and asks for a bug report; the checkers stop after 30 s by design."""
    said = []
    with with_reporter(said.append):
        differential._engine.report("WARNING: Hypothesis has spent more than five minutes working to shrink a failing "
                                    "test case ... PLEASE REPORT THIS if you can")
        differential._engine.report("something else")
    assert len(said) == 2 and "30 s" in said[0] and "five minutes" not in said[0] and "REPORT" not in said[0]
    assert said[1] == "something else"


class Side:
    def __init__(self, b):
        self.b = b


def test_a_replay_marks_refused_calls_and_shows_the_differing_fields_in_full():
    twins = Twins(Side(1), Side(2))
    assert twins.call("check_request([1], max_new_tokens=0)", lambda side: gpt.check_request([1], 0, 16)) is None
    long = list(range(200))  # equal on both sides: left out, not a cut-off dump
    with pytest.raises(Divergence) as failure:
        twins.call("read()", lambda side: {"a": long, "b": [side.b] * 100})
    message = str(failure.value)
    assert re.search(r"1\. check_request\(\[1\], max_new_tokens=0\)  -> refused by both: ValueError: ", message), message
    assert "b, the reference: " + repr([1] * 100) in message and "b, yours: " + repr([2] * 100) in message, message
    assert "199" not in message and "1 other field is equal" in message, message


def test_refused_names_the_input():
    with pytest.raises(AssertionError, match=r"generate with max_new_tokens=0 should have been refused with ValueError"):
        with refused(ValueError, "generate with max_new_tokens=0"):
            pass
    with refused((TypeError, ValueError), "anything") as error:
        raise ValueError("no")
    assert str(error.value) == "no"


def grade(exercise, control, *selection):
    proc = subprocess.run([sys.executable, "-m", "pytest", f"exercises/test_{exercise}.py", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "--seed=7", "--impl=solutions", f"--replace={exercise}=tests.controls.{control}", "-m", "not timing",
                           "-k", " or ".join(selection)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, f"the control was not caught (exit code {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def assert_on_one_screen(report):
    lines = report.strip().splitlines()
    assert len(lines) <= SCREEN, f"{len(lines)} lines, more than a screen ({SCREEN}):\n{report}"
    assert "pluggy" not in report and "_pytest" not in report and "site-packages" not in report, report


def test_a_slot_never_freed_is_one_short_report_that_names_engine_step():
    """Three checks fail the same way: told in full once, twice as 'the same failure as', once in the causes."""
    report = grade("ex4_continuous_batching", "ex4_finished_slot_never_freed",
                   "every_request_finishes_exactly_once", "differential_generate", "batch_never_exceeds_max_batch_size and 1")
    assert_on_one_screen(report)
    assert report.count("The same failure as test_differential_generate") == 2, report
    assert "3 checks failed, from 1 cause:" in report, report
    assert "still taken" in report and "Look at Engine.step." in report and "python scripts/hint.py 4 Engine.step" in report, report
    assert "arrival_step" in report, report  # the replay's requests show when they arrive


def test_a_block_never_returned_names_the_allocators_free():
    report = grade("ex5_paged_kv_cache", "ex5_free_leaks", "5a_allocator_counts_owners", "5a_block_table_takes")
    assert_on_one_screen(report)
    assert report.count("Look at BlockAllocator.free.") == 4, report  # one check, and a parametrized one three times
    assert "python scripts/hint.py 5 BlockAllocator.free" in report, report


def test_a_request_not_refused_says_which_input():
    report = grade("ex6_decoding", "ex6_beam_accepts_zero_beams", "6c_bad_beam_search_is_refused")
    assert_on_one_screen(report)
    assert "beam_search with num_beams=0 should have been refused with ValueError" in report, report
    assert "DID NOT RAISE" not in report and "Look at beam_search." in report, report


def test_an_unfinished_todo_still_reads_as_such():
    proc = subprocess.run([sys.executable, "-m", "pytest", "exercises/test_ex5_paged_kv_cache.py", "-q", "-n", "0", "-p",
                           "no:cacheprovider", "--seed=7", "-k", "5a_allocator_counts_owners"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    if "Not implemented yet" not in proc.stdout and proc.returncode == 0:
        pytest.skip("exercises/ex5_paged_kv_cache.py is solved here: no TODO left to report")
    assert "Not implemented yet. Exercise 5:" in proc.stdout and "Look at" not in proc.stdout, proc.stdout
