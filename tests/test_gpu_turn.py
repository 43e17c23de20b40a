"""harness.gpu_turn: checkers share one GPU between pytest-xdist workers, but a timing check has it alone."""

import multiprocessing
import time

from workshop.grading.harness import gpu_turn


def hold(lock, name, alone, start_after, seconds, intervals, first_in):
    if start_after:  # after the first check holds the card
        first_in.wait(10)
        time.sleep(start_after)
    with gpu_turn(lock, alone):
        first_in.set()
        began = time.monotonic()
        time.sleep(seconds)
        intervals.put((name, began, time.monotonic()))


def run(lock, plan):
    context = multiprocessing.get_context("fork")
    intervals, first_in = context.Queue(), context.Event()
    processes = [context.Process(target=hold, args=(lock, *step, intervals, first_in)) for step in plan]
    for p in processes:
        p.start()
    for p in processes:
        p.join(30)
    return {name: (began, ended) for name, began, ended in (intervals.get(timeout=5) for _ in plan)}


def overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_checks_share_the_card(tmp_path):
    got = run(tmp_path / "gpu", [("first", False, 0, 0.6), ("second", False, 0.1, 0.6)])
    assert overlap(got["first"], got["second"]), f"two checks that do not time themselves should run side by side: {got}"


def test_a_timing_check_has_the_card_alone(tmp_path):
    """A timed check that arrives while another check runs waits for it; a check arriving while the timed
    one waits or runs (the turnstile) waits too, and never shares the card with it."""
    got = run(tmp_path / "gpu", [("running", False, 0, 1.0), ("timed", True, 0.1, 0.5), ("late", False, 0.4, 0.3),
                                 ("later", False, 0.5, 0.3)])
    assert not any(overlap(got["timed"], got[name]) for name in ("running", "late", "later")), f"the timed check shared the card: {got}"
    assert got["running"][1] <= got["timed"][0] <= got["late"][0], f"the timed check should go after the one running, before later arrivals: {got}"
