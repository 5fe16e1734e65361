"""The embedded default stream: append-only logs in memory, Kafka's semantics in miniature (topics
of one partition, committed offsets per consumer group, seek, at-least-once redelivery)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dinrec.streams.base import Consumer, EventStream, OutgoingRecord, PartitionsHook, Record


@dataclass
class _Broker:
    logs: dict[str, list[OutgoingRecord]] = field(default_factory=dict)
    committed: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, topic) -> next offset
    cond: threading.Condition = field(default_factory=threading.Condition)


class InProcessStream(EventStream):
    def __init__(self, topic: str = "dinrec.events", *, _broker: _Broker | None = None) -> None:
        self.topic = topic
        self._b = _broker or _Broker()

    @property
    def _log(self) -> list[OutgoingRecord]:
        return self._b.logs.setdefault(self.topic, [])

    def publish_raw(self, records: Sequence[OutgoingRecord]) -> None:
        with self._b.cond:
            self._log.extend(records)
            self._b.cond.notify_all()

    def consumer(self, group: str, *, on_assigned: PartitionsHook | None = None,
                 on_revoked: PartitionsHook | None = None) -> Consumer:
        return _InProcessConsumer(self, group, on_assigned)

    def sibling(self, topic: str) -> EventStream:
        return InProcessStream(topic, _broker=self._b)

    def end_offsets(self) -> dict[int, int]:
        with self._b.cond:
            return {0: len(self._log)}


class _InProcessConsumer(Consumer):
    def __init__(self, stream: InProcessStream, group: str, on_assigned: PartitionsHook | None) -> None:
        self._s = stream
        self._group = group
        with stream._b.cond:
            self._position = stream._b.committed.get((group, stream.topic), 0)
        if on_assigned is not None:  # the only member of its group: it owns the one partition at once
            on_assigned({0})

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        b = self._s._b
        with b.cond:
            log = self._s._log
            b.cond.wait_for(lambda: len(log) > self._position, timeout=timeout_s)
            end = min(len(log), self._position + max_records)
            out = [Record(log[i].value, 0, i, log[i].key, log[i].headers, log[i].timestamp_ms)
                   for i in range(self._position, end)]
            self._position = end
        return out

    def seek(self, partition: int, offset: int) -> None:
        if partition == 0:
            with self._s._b.cond:
                self._position = max(0, offset)

    def highwaters(self) -> dict[int, int]:
        return self._s.end_offsets()

    def commit(self, offsets: Mapping[int, int]) -> None:
        if 0 in offsets:
            with self._s._b.cond:
                self._s._b.committed[(self._group, self._s.topic)] = offsets[0]
