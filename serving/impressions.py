"""Impression logging, off the request path: one event per item of every list served.

The request hands its list to a bounded queue (a few microseconds); a background thread builds the
events and writes them in batches to the sink — the outbox (so, the stream: A/B counters and the
next retraining's data) or the store directly. Event ids are ``imp-{request_id}-{position}``, so a
batch written twice is counted once. If the queue is full (the sink is stuck), lists are dropped and
counted (``dinrec_impressions_dropped_total``), never blocking a request.

Nothing one request carries can end the logger: a list whose events do not validate is dropped and
counted on its own, and an error nobody foresaw is logged and the loop goes on (``alive`` says so;
readiness and ``dinrec_thread_alive`` read it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from dinrec.events.schema import BehaviourEvent, describe
from dinrec.experiments.served import Tally

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedList:
    request_id: str
    user_id: str
    items: Sequence[tuple[str, str]]  # (item, category), in the order shown
    experiment: str | None
    variant: str | None
    model_version: str
    ts: float
    degraded: bool = False  # answered in a degraded mode (serving.degraded)
    latency_ms: float = 0.0  # from the request's start to its list
    tail_items: int = 0  # of ``items``, how many are long-tail (the model's popularity)

    def events(self) -> list[BehaviourEvent]:
        return [BehaviourEvent(event_id=f"imp-{self.request_id}-{pos}", user_id=self.user_id, item_id=item,
                               category_id=cat, event_type="impression", ts=self.ts, request_id=self.request_id,
                               position=pos, experiment=self.experiment, variant=self.variant,
                               model_version=self.model_version)
                for pos, (item, cat) in enumerate(self.items)]


class ImpressionLog:
    def __init__(self, sink: Callable[[list[BehaviourEvent]], object], *, max_pending: int = 20_000,
                 batch: int = 200, on_drop: Callable[[int], None] = lambda n: None,
                 on_served: Callable[[str, dict[str, Tally]], None] | None = None) -> None:
        """``on_served(experiment, tallies)``: each batch's lists of an experiment, tallied per variant
        (experiments.served), e.g. into the shared experiment state."""
        self._sink, self._batch, self._on_drop, self._on_served = sink, batch, on_drop, on_served
        self._queue: queue.Queue[ServedList | None] = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name="dinrec-impressions", daemon=True)
        self._thread.start()

    def log(self, served: ServedList) -> None:
        try:
            self._queue.put_nowait(served)
        except queue.Full:
            self._on_drop(len(served.items))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            lists = [self._queue.get()]
            while len(lists) < self._batch:
                try:
                    lists.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = None in lists
            try:
                events = [e for s in lists if s is not None for e in self._events(s)]
                if events:
                    self._write(events)
            except Exception:  # noqa: BLE001 - a bug in one batch must not end logging for the worker's life
                log.exception("impression batch of %d lists lost", len(lists))
                self._on_drop(sum(len(s.items) for s in lists if s is not None))
            self._tally([s for s in lists if s is not None])

    def _tally(self, lists: list[ServedList]) -> None:
        """What each arm served in this batch, added to the shared totals (a failure loses this batch's
        tallies only: they are figures to watch, not counts anything is decided on)."""
        if self._on_served is None:
            return
        by_experiment: dict[str, dict[str, Tally]] = {}
        for s in lists:
            if s.experiment and s.variant:
                tally = by_experiment.setdefault(s.experiment, {}).setdefault(s.variant, Tally())
                tally.add((item for item, _ in s.items), degraded=s.degraded, latency_ms=s.latency_ms,
                          tail_items=s.tail_items)
        for experiment, tallies in by_experiment.items():
            try:
                self._on_served(experiment, tallies)
            except Exception as exc:  # noqa: BLE001 - the store may be down; the next batch tries again
                log.warning("served-list figures of %s not recorded: %s", experiment, exc)

    def _events(self, served: ServedList) -> list[BehaviourEvent]:
        try:
            return served.events()
        except ValidationError as exc:  # an id the event schema refuses: this list only
            log.error("impressions of request %r not logged: %s", served.request_id[:64], describe(exc))
            self._on_drop(len(served.items))
            return []

    def _write(self, events: list[BehaviourEvent]) -> None:
        for attempt in range(3):
            try:
                self._sink(events)
                return
            except Exception as exc:  # noqa: BLE001 - a sink failure must not end the logger
                log.warning("impression log write failed (attempt %d): %s", attempt + 1, exc)
                time.sleep(0.2 * (attempt + 1))
        self._on_drop(len(events))

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout=timeout_s)
