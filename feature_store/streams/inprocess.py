"""The embedded default stream: one append-only log in memory, Kafka's semantics in miniature
(one partition, committed offsets per consumer group, at-least-once redelivery)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from feature_store.schema import BehaviourEvent
from feature_store.streams.base import Consumer, EventStream, Record


class InProcessStream(EventStream):
    def __init__(self) -> None:
        self._log: list[bytes] = []
        self._committed: dict[str, int] = {}
        self._cond = threading.Condition()

    def publish(self, events: Sequence[BehaviourEvent]) -> None:
        encoded = [e.to_bytes() for e in events]
        with self._cond:
            self._log.extend(encoded)
            self._cond.notify_all()

    def publish_raw(self, payloads: Sequence[bytes]) -> None:
        """Append bytes as they are (tests use it to send malformed events)."""
        with self._cond:
            self._log.extend(payloads)
            self._cond.notify_all()

    def consumer(self, group: str) -> Consumer:
        return _InProcessConsumer(self, group)


class _InProcessConsumer(Consumer):
    def __init__(self, stream: InProcessStream, group: str) -> None:
        self._s = stream
        self._group = group
        with stream._cond:
            self._position = stream._committed.get(group, 0)

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        s = self._s
        with s._cond:
            s._cond.wait_for(lambda: len(s._log) > self._position, timeout=timeout_s)
            end = min(len(s._log), self._position + max_records)
            out = [Record(s._log[i], 0, i) for i in range(self._position, end)]
            self._position = end
        return out

    def commit(self) -> None:
        with self._s._cond:
            self._s._committed[self._group] = self._position
