"""The event-stream interface (publish; consume in a group; seek; commit) and its factory.

Every backend carries events as the bytes of ``BehaviourEvent.to_bytes()``, the in-process one
included, so a serialisation bug shows up on a laptop, not first in production. Events are keyed
by user, so one user's events stay in one partition, in order.

Delivery is at least once. The consumer's committed offsets are a hint (where to start, how far
behind it is); the exact position of ingestion is kept by the online store, written atomically
with the events (see feature_store.ingest), so a consumer that dies anywhere resumes exactly.
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from dinrec.events.schema import BehaviourEvent

DLQ_SUFFIX = ".dlq"
Headers = tuple[tuple[str, bytes], ...]
PartitionsHook = Callable[[set[int]], None]


class Record(NamedTuple):  # a tuple: consumers make one per event, at tens of thousands a second
    """A consumed record."""

    value: bytes
    partition: int
    offset: int
    key: bytes | None = None
    headers: Headers = ()
    timestamp_ms: int | None = None  # when it was produced


@dataclass(frozen=True)
class OutgoingRecord:
    """A record to publish as it is: bytes, an optional key (picks the partition) and headers."""

    value: bytes
    key: bytes | None = None
    headers: Headers = ()
    timestamp_ms: int | None = None  # its produce time; None: when it is published (a replay sets it)


def event_record(event: BehaviourEvent) -> OutgoingRecord:
    return OutgoingRecord(event.to_bytes(), key=event.user_id.encode())


class MembershipChanges:
    """Partition assignments and revocations, queued by the consumer's callbacks (which run inside
    ``poll``) and taken by the consuming loop between polls, where acting on them is safe."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[tuple[str, set[int]]] = queue.SimpleQueue()

    def assigned(self, partitions: set[int]) -> None:
        self._q.put(("assigned", partitions))

    def revoked(self, partitions: set[int]) -> None:
        self._q.put(("revoked", partitions))

    def take(self) -> Iterator[tuple[str, set[int]]]:
        """("assigned" | "revoked", partitions) in the order they happened, until none is left."""
        while True:
            try:
                yield self._q.get_nowait()
            except queue.Empty:
                return


class Consumer(ABC):
    """One member of a consumer group on one topic.

    ``on_assigned``/``on_revoked`` (given to :meth:`EventStream.consumer`) are told which
    partitions this member gained or lost; they may be called from the client's I/O thread, so
    they should only record the change.
    """

    @abstractmethod
    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records after the current positions; [] after ``timeout_s``."""

    @abstractmethod
    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (the earliest retained one if it is gone). A
        partition this member no longer owns is ignored."""

    @abstractmethod
    def commit(self, offsets: Mapping[int, int]) -> None:
        """Record, for the group, the next offset to read in each partition."""

    @abstractmethod
    def highwaters(self) -> dict[int, int]:
        """Per owned partition, the offset of the next record to be produced, as last seen (no I/O)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class EventStream(ABC):
    """A named topic on a broker (or in this process)."""

    topic: str

    def publish(self, events: Sequence[BehaviourEvent]) -> None:
        """Send events, keyed by user; returns once the broker has them all."""
        self.publish_raw([event_record(e) for e in events])

    @abstractmethod
    def publish_raw(self, records: Sequence[OutgoingRecord]) -> None:
        """Send records as they are; returns once the broker has them all."""

    @abstractmethod
    def consumer(self, group: str, *, on_assigned: PartitionsHook | None = None,
                 on_revoked: PartitionsHook | None = None) -> Consumer: ...

    @abstractmethod
    def sibling(self, topic: str) -> EventStream:
        """The same broker, another topic."""

    def dead_letters(self) -> EventStream:
        """Where records that cannot be ingested go, with the reason: ``<topic>.dlq``."""
        return self.sibling(self.topic + DLQ_SUFFIX)

    @abstractmethod
    def end_offsets(self) -> dict[int, int]:
        """Per partition, the offset the next published record will get."""

    def ensure_topic(self, partitions: int, replication: int = 1) -> int:  # noqa: B027 - optional hook
        """Create the topic if it is missing; return its partition count."""
        return 1

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

