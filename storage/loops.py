"""Background threads, each shape written once, at the bottom so every room uses the same two.

* :func:`every` — "on a daemon thread, call this every so often until told to stop; an error is logged and
  the next round tries again": the service's pollers (model alias, guardrail, catalog, experiments file),
  the lease's renewals, the spot interruption watcher, the GPU sampler. A poller that died on one bad read
  would leave its owner silently stale.
* :func:`supervise` — a long-running body (a consumer) restarted with backoff when it raises.
* :func:`worker` — "do the work there is, then sleep until woken (or a while); an error is logged and waited
  out with backoff": the outbox's sender, which a put wakes at once instead of at its next poll.

:class:`Backoff` is the one retry delay: these loops, the partitioned consumers' (streams.consuming) and the
outbox's retries use it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("dinrec.loops")


@dataclass
class Backoff:
    """Exponential backoff with full jitter, reset by a success."""

    initial_s: float = 0.1
    max_s: float = 5.0
    _attempt: int = 0

    def next_delay(self) -> float:
        self._attempt += 1
        return random.uniform(0, min(self.max_s, self.initial_s * 2 ** (self._attempt - 1)))

    def reset(self) -> None:
        self._attempt = 0


def every(interval_s: float, stop: threading.Event, fn: Callable[[], object], *, name: str,
          first_now: bool = False) -> threading.Thread:
    """Start a daemon thread ``name`` that calls ``fn`` every ``interval_s`` seconds (first at once with
    ``first_now``, else after one interval) until ``stop`` is set. An exception from ``fn`` is logged as
    a warning naming the thread (``fn`` logs its own, more specific errors where it has them) and the
    loop goes on."""

    def loop() -> None:
        if first_now or not stop.wait(interval_s):
            while True:
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - one bad round must not end the poller
                    log.warning("%s failed; will retry: %s", name, exc)
                if stop.wait(interval_s):
                    return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def supervise(body: Callable[[], object], stop: threading.Event, *, name: str,
              on_restart: Callable[[], None] = lambda: None,
              backoff_s: tuple[float, float] = (0.2, 30.0)) -> threading.Thread:
    """Start a daemon thread ``name`` that runs ``body`` until it returns (its own stop) or ``stop`` is set.
    If ``body`` raises, the error is logged with its traceback, ``on_restart`` counts it, and ``body`` runs
    again after a :class:`Backoff` from ``backoff_s[0]`` up to ``backoff_s[1]`` seconds: a consumer that
    meets an error nobody foresaw keeps consuming, and says so, instead of ending silently."""

    def loop() -> None:
        backoff = Backoff(*backoff_s)
        while not stop.is_set():
            try:
                body()
                return
            except Exception:  # noqa: BLE001 - the thread must outlive any one error
                delay = backoff.next_delay()
                log.exception("%s failed; restarting in %.1fs", name, delay)
                on_restart()
            if stop.wait(delay):
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def worker(step: Callable[[], bool], stop: threading.Event, *, name: str, wake: threading.Event,
           idle_s: float = 0.5, outages: tuple[type[Exception], ...] = (),
           context: Callable[[], str] = lambda: "") -> threading.Thread:
    """Start a daemon thread ``name`` that calls ``step`` until ``stop`` is set: again at once while it
    returns True (it did something; there may be more), else after ``wake`` is set or ``idle_s`` passes,
    whichever comes first — a producer sets ``wake`` when it adds work, so the work starts at once, not
    at the next round. ``wake`` is cleared before each ``step``, so one set while ``step`` looks for work
    is never lost. A ``step`` that raises is retried after a :class:`Backoff` delay (reset by one that
    returns): an error among ``outages`` is logged as a warning, any other with its traceback; ``context()``
    adds the state worth knowing to either line, in brackets (e.g. how much waits). Setting ``stop`` should set ``wake``
    too, or the thread sleeps out its ``idle_s``."""

    def loop() -> None:
        backoff = Backoff()
        while not stop.is_set():
            wake.clear()
            try:
                busy = step()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any one error
                delay = backoff.next_delay()
                detail = context()
                detail = f" ({detail})" if detail else ""
                if isinstance(exc, outages):
                    log.warning("%s: %s%s; retrying in %.2fs", name, exc, detail, delay)
                else:
                    log.exception("%s failed%s; retrying in %.2fs", name, detail, delay)
                stop.wait(delay)
                continue
            backoff.reset()
            if not busy:
                wake.wait(idle_s)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
