"""The pollers' one loop: a failing round is reported and the next one runs; stop ends it."""

from __future__ import annotations

import threading

from dinrec.storage.loops import every


def test_a_failing_round_is_reported_and_the_loop_goes_on_until_stopped(caplog):
    stop, third = threading.Event(), threading.Event()
    calls: list[int] = []

    def fn() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("store down")
        if len(calls) == 3:
            third.set()

    thread = every(0.001, stop, fn, name="test-poller", first_now=True)
    assert thread.name == "test-poller" and thread.daemon
    assert third.wait(10), "the loop ended after the failing round"
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    failures = [r.getMessage() for r in caplog.records if r.name == "dinrec.loops"]
    assert failures == ["test-poller failed; will retry: store down"] and len(calls) >= 3


def test_without_first_now_nothing_runs_before_the_first_interval():
    stop, calls = threading.Event(), []
    stop.set()  # stopped before the first interval ends: fn never runs
    thread = every(3600, stop, lambda: calls.append(1), name="idle")
    thread.join(10)
    assert not thread.is_alive() and calls == []
    ran = threading.Event()
    stopped_first = threading.Event()
    stopped_first.set()
    thread = every(3600, stopped_first, ran.set, name="eager", first_now=True)  # first_now: one round, then stop
    thread.join(10)
    assert ran.is_set() and not thread.is_alive()
