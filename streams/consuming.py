"""The partitioned consumer loop, written once: ingestion and the archive are two sinks of it.

Both consume a topic in a consumer group the same way and differ only in what they do with the
records (feature_store.ingest writes them to the online store, streams.archive to hour files). The
loop (:class:`ConsumerLoop`) owns what every such consumer needs:

* the group's membership: assignments and revocations, queued by the consumer's hooks (which run
  inside ``poll``) and handed to the sink between polls, where acting on them is safe;
* when to stop: a stop event, ``max_records`` settled, or ``idle_exit_s`` without a record;
* retrying an outage with :class:`Backoff` — the stream's (StreamUnavailable) and whatever the sink
  declares transient (the store's, the storage's) — for as long as it takes, the records in hand
  kept: a round that raised runs again;
* the end: at a stop the sink settles what it holds once (what it cannot is redelivered to the next
  owner); after ``max_records`` or idleness nothing more is polled and the sink's work goes on, retried,
  until it holds nothing.

What makes each sink exact stays in the sink: ingestion's offsets in the store, the archive's files.
A sink (:class:`PartitionedSink`) says how many records it takes now, whether it has work in flight,
takes records, does its work, and counts what it holds and what it has settled.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod

from dinrec.storage.loops import Backoff
from dinrec.streams.base import EventStream, MembershipChanges, Record
from dinrec.streams.errors import StreamUnavailable

log = logging.getLogger(__name__)


class PartitionedSink(ABC):
    """What a partitioned consumer does with its records; :class:`ConsumerLoop` calls these, one at a
    time, from the thread that runs it."""

    name: str  # names the consumer in the loop's log lines ("ingest", "archive")

    @abstractmethod
    def assigned(self, partitions: set[int]) -> None:
        """This member now owns ``partitions``. Only note it: the I/O it calls for (where to resume them)
        belongs in :meth:`work`, where a failure is retried — an error here would lose the change."""

    @abstractmethod
    def revoked(self, partitions: set[int]) -> None:
        """This member lost ``partitions``: drop what is held of them (their new owner reads them again)."""

    @abstractmethod
    def wanted(self) -> int:
        """How many records to take now (0: none, e.g. a batch waits to be written again)."""

    @property
    def busy(self) -> bool:
        """Work is in flight (ingestion's write on its thread): polls don't wait beside it, and an empty
        one is not idleness."""
        return False

    @abstractmethod
    def accept(self, records: list[Record]) -> None:
        """Take polled records, in stream order. No I/O, nothing that can fail: the consumer is past them."""

    @abstractmethod
    def work(self, finishing: bool) -> None:
        """Do what is due, once per round (quiet rounds too): write what is in hand, commit hints, flush
        by age. What raises keeps its records in hand, and the next round does it again. ``finishing``:
        nothing more will be taken (``max_records`` or idleness), so settle everything held."""

    @abstractmethod
    def in_hand(self) -> int:
        """Records taken and not yet settled."""

    @abstractmethod
    def settled(self) -> int:
        """Records settled so far: what ``max_records`` counts."""

    @abstractmethod
    def drain(self) -> None:
        """At a stop: settle what is in hand, trying once (what fails is redelivered to the next owner)."""

    def is_transient(self, exc: Exception) -> bool:
        """Whether ``exc`` from this sink is an outage to wait out (StreamUnavailable always is)."""
        return False

    def retried(self, exc: Exception) -> None:  # noqa: B027 - optional hook
        """A round failed with the outage ``exc`` and will run again (counted in the sink's stats)."""


class ConsumerLoop:
    """One member of consumer group ``group`` on ``stream``'s topic, feeding ``sink`` (see the module
    docstring). ``consumer`` is the sink's too: it seeks and commits with it."""

    def __init__(self, stream: EventStream, group: str, sink: PartitionedSink, *,
                 backoff: Backoff | None = None) -> None:
        self.sink = sink
        self._backoff = backoff or Backoff()
        self._changes = MembershipChanges()
        self.consumer = stream.consumer(group, on_assigned=self._changes.assigned, on_revoked=self._changes.revoked)

    def run(self, stop: threading.Event | None = None, *, max_records: int | None = None,
            idle_exit_s: float | None = None, poll_timeout_s: float = 0.5) -> None:
        """Consume until ``stop`` is set, ``max_records`` are settled, or nothing arrives for
        ``idle_exit_s`` seconds (then the sink settles what it holds first); at a stop the sink drains."""
        stop = stop or threading.Event()
        sink = self.sink
        last_data = time.monotonic()
        idle = False
        while not stop.is_set():
            in_hand = sink.in_hand()
            room = None if max_records is None else max_records - sink.settled() - in_hand
            finishing = idle or (room is not None and room <= 0)
            if finishing and in_hand == 0:
                break
            quiet = False  # an empty poll that waited: the stream has nothing for us
            try:
                self._take_changes()
                want = 0 if finishing else sink.wanted() if room is None else min(sink.wanted(), room)
                if want > 0:
                    busy = sink.busy
                    records = self.consumer.poll(max_records=want, timeout_s=0.0 if busy else poll_timeout_s)
                    self._take_changes()  # before the records: those of a revoked partition are not ours
                    if records:
                        last_data = time.monotonic()
                        sink.accept(records)
                    quiet = not records and not busy
                sink.work(finishing)
                self._backoff.reset()
            except Exception as exc:
                if not self._transient(exc):
                    raise
                delay = self._backoff.next_delay()
                sink.retried(exc)
                log.warning("%s: %s; retrying in %.2fs", sink.name, exc, delay)
                stop.wait(delay)
                continue
            if quiet and idle_exit_s is not None and time.monotonic() - last_data >= idle_exit_s:
                idle = True
        self._drain()

    def close(self) -> None:
        self.consumer.close()

    def _transient(self, exc: Exception) -> bool:
        return isinstance(exc, StreamUnavailable) or self.sink.is_transient(exc)

    def _take_changes(self) -> None:
        """Hand the sink the membership changes since the last call, in order. The consumer's hooks run
        inside ``poll`` (librdkafka serves rebalances there; the in-process stream assigns at once), so
        what is taken after a poll holds until the next one."""
        for kind, parts in self._changes.take():
            log.info("%s: partitions %s %s", self.sink.name, sorted(parts), kind)
            if kind == "assigned":
                self.sink.assigned(parts)
            else:
                self.sink.revoked(parts)

    def _drain(self) -> None:
        try:
            self._take_changes()
            self.sink.drain()
        except Exception as exc:
            if not self._transient(exc):
                raise
            log.warning("%s: stopping with %d records in hand (%s); they will be redelivered",
                        self.sink.name, self.sink.in_hand(), exc)
