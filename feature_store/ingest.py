"""Ingestion: stream → validate → online store, exactly once in effect, whatever crashes.

How a record is applied exactly once on an at-least-once stream:

* The store keeps, per partition, the last offset it has applied, written by the same atomic
  step as the events (:class:`StreamOffsets`). The consumer's committed offsets are only a hint.
* When a partition is assigned, the ingestor asks the store where it is and drops what the store
  already holds (a crash between the write and the commit redelivers it), or seeks back if the
  store is behind what the stream hands out (the store lost writes, e.g. Redis restarted from an
  older snapshot).
* Every write names the offsets it believes the store holds; if another member or a restarted
  store disagrees, nothing is written (OffsetConflict) and the partition is re-read from the
  store's offset.
* A duplicate *event* (the same event id sent twice, e.g. a client retry) is absorbed by the
  store's per-user dedup window.

A store sharded by partition (``store.partitions`` > 1, events.partitioning) needs the topic to
have as many partitions (checked at start) and each record on its user's partition: one that is not
(a producer with another partitioner) is dead-lettered, since writing it beside the offsets of its
partition would put it where serving never looks.

Records that fail validation go to the dead-letter topic (``<topic>.dlq``) with the reason and the
original bytes, before the offsets covering them are written; ingestion never stops on bad input.
A store or stream failure is retried with backoff, holding the batch, for as long as it takes (the
consumer loop shared with the archive does that: streams.consuming).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from dinrec.events.errors import InvalidEvent
from dinrec.events.partitioning import partition_of
from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.errors import OffsetConflict, StoreLayoutError, StoreUnavailable
from dinrec.feature_store.ingest_stats import IngestStats
from dinrec.feature_store.online.base import OnlineStore, StreamOffsets
from dinrec.storage.loops import Backoff
from dinrec.streams.base import EventStream, OutgoingRecord, Record
from dinrec.streams.consuming import ConsumerLoop, PartitionedSink
from dinrec.streams.errors import StreamUnavailable

log = logging.getLogger(__name__)

# Dead-letter headers: why, and where the record came from (topic/partition/offset).
ERROR_HEADER = "dinrec-error"
SOURCE_HEADER = "dinrec-source"


Decoded = tuple[Record, BehaviourEvent | InvalidEvent]


@dataclass
class _Batch:
    items: list[Decoded]
    dead_sent: bool = False  # its dead letters are out (never sent twice, whatever is retried)


@dataclass
class _Write:
    batch: _Batch
    offsets: StreamOffsets
    result: Future[int]
    started: float
    applied_s: float = 0.0     # perf_counter when the store answered (accounted for after)
    applied_at: float = 0.0    # the same moment on the wall clock (records' ages end there)


class Ingestor(PartitionedSink):
    """Consumes one topic in a consumer group into an online store (see the module docstring): a sink
    of the shared consumer loop (streams.consuming), which polls, hands over the group's assignments,
    retries the store's and the stream's outages and decides when to stop; what is here is ingestion's
    own: decoding, dead letters, the store's offsets and the pipelined writes.

    Writes are pipelined one deep: while the store applies batch k (on a writer thread, so a
    network round trip or Redis' own work overlaps), the loop polls and decodes batch k+1. Batch
    k+1's write starts only after k's has returned, since it names the offsets k left behind.
    """

    name = "ingest"

    def __init__(self, stream: EventStream, store: OnlineStore, group: str, *, batch_size: int = 500,
                 commit_interval_s: float = 1.0, backoff: Backoff | None = None,
                 stats: IngestStats | None = None,
                 on_applied: Callable[[list[Record]], None] | None = None) -> None:
        self.topic = stream.topic
        self.store = store
        self.stats = stats or IngestStats()
        self._dead = stream.dead_letters()
        self._batch_size = batch_size
        self._commit_interval_s = commit_interval_s
        self._on_applied = on_applied  # told of each batch once the store has it (benchmarks time it)
        # partition -> the last offset the store holds, as far as we know; None: ask the store.
        self._believed: dict[int, int | None] = {}
        self._queue: deque[_Batch] = deque()  # polled, not yet written, in stream order
        self._inflight: _Write | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dinrec-ingest-write")
        self._committed: dict[int, int] = {}
        self._last_commit = time.monotonic()
        self._shards = store.partitions
        if self._shards > 1:
            self._check_partition_count(stream)
        self._loop = ConsumerLoop(stream, group, self, backoff=backoff)
        self.consumer = self._loop.consumer

    def _check_partition_count(self, stream: EventStream) -> None:
        try:
            have = len(stream.end_offsets())
        except StreamUnavailable as exc:  # checked record by record meanwhile (_decode_routed)
            log.warning("ingest: cannot count the partitions of %s yet (%s)", self.topic, exc)
            return
        if have and have != self._shards:
            raise StoreLayoutError(
                f"topic {self.topic!r} has {have} partitions and the store {self._shards} shards: they must be equal "
                "(DINREC_STORE_PARTITIONS), or the store 1 shard")

    def _decode_routed(self, record: Record) -> BehaviourEvent | InvalidEvent:
        event = _decode(record)
        if self._shards > 1 and isinstance(event, BehaviourEvent):
            home = partition_of(event.user_id, self._shards)
            if home != record.partition:
                return InvalidEvent(
                    f"user {event.user_id!r} belongs to partition {home} (CRC-32 of the user id, librdkafka's "
                    f"consistent_random) but arrived on {record.partition}: its producer does not key events by "
                    "user with that partitioner")
        return event

    # -------------------------------------------------------------- the loop (streams.consuming runs it)
    def run(self, stop: threading.Event | None = None, *, max_records: int | None = None,
            idle_exit_s: float | None = None, poll_timeout_s: float = 0.5) -> IngestStats:
        """Consume until ``stop`` is set, ``max_records`` are settled, or nothing arrives for
        ``idle_exit_s`` seconds; then finish the batches in hand, commit and return the stats."""
        log.info("ingest: consuming %s into the store", self.topic)
        self._loop.run(stop, max_records=max_records, idle_exit_s=idle_exit_s, poll_timeout_s=poll_timeout_s)
        return self.stats

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._loop.close()
        self._dead.close()

    def wanted(self) -> int:
        return 0 if self._queue else self._batch_size  # a batch waiting is written (or retried) first

    @property
    def busy(self) -> bool:
        return self._inflight is not None  # polls overlap the write; with one waiting, briefly: it is due now

    def accept(self, records: list[Record]) -> None:
        self._queue.append(_Batch([(r, self._decode_routed(r)) for r in records]))

    def work(self, finishing: bool) -> None:
        """Settle the write in flight and start the next (Store/StreamUnavailable: the batch is kept, and
        the loop retries); commit hints when due."""
        # The next batch goes to the writer before the finished one is accounted for (its per-record
        # bookkeeping would otherwise hold the writer idle between two writes).
        done = self._settle_write()
        try:
            if self._queue:
                self._start_write()
        finally:
            if done is not None:
                self._account(*done)
        self._maybe_commit()

    def in_hand(self) -> int:
        return sum(len(b.items) for b in self._queue) + (len(self._inflight.batch.items) if self._inflight else 0)

    def settled(self) -> int:
        return self.stats.consumed

    def is_transient(self, exc: Exception) -> bool:
        return isinstance(exc, StoreUnavailable)

    def retried(self, exc: Exception) -> None:
        with self.stats.lock:
            self.stats.retries += 1

    def drain(self) -> None:
        """At a stop: finish the write in flight and write what was polled, once each (what fails is
        redelivered to whoever consumes next, and the store's offsets keep that exact); commit."""
        try:
            self._finish_write()
            while self._queue:
                self._start_write()
                self._finish_write()
        finally:
            self._commit(force=True)

    # -------------------------------------------------------------- one batch
    def _start_write(self) -> None:
        """Send the first queued batch to the writer thread (raises Store/StreamUnavailable, the
        batch kept, to be retried)."""
        batch = self._queue[0]
        batch.items, expected = self._drop_what_the_store_holds(batch.items)
        if not batch.items:
            self._queue.popleft()
            return
        if not batch.dead_sent:
            self._send_dead_letters(batch.items)
            batch.dead_sent = True
        parts = {r.partition for r, _ in batch.items}
        offsets = StreamOffsets(self.topic, expected=expected,
                                last={p: max(r.offset for r, _ in batch.items if r.partition == p) for p in parts})
        events = [e for _, e in batch.items if isinstance(e, BehaviourEvent)]
        self._inflight = _Write(batch, offsets, self._writer.submit(self.store.write, events, offsets),
                                time.perf_counter())
        self._queue.popleft()

    def _finish_write(self) -> None:
        """Wait for the write in flight and account for it (see :meth:`_settle_write`)."""
        done = self._settle_write()
        if done is not None:
            self._account(*done)

    def _settle_write(self) -> tuple[_Write, int] | None:
        """Wait for the write in flight; return it and how many records it applied for
        :meth:`_account`, the offsets it wrote already believed (the next write builds on them). A
        failed one goes back to the head of the queue (raising Store/StreamUnavailable), a refused one
        re-reads its partitions (None: nothing to account for)."""
        w, self._inflight = self._inflight, None
        if w is None:
            return None
        try:
            applied = w.result.result()
        except OffsetConflict as exc:
            log.warning("ingest: %s; re-reading those partitions from the store's offsets", exc)
            self._queue.appendleft(w.batch)
            for p, stored in exc.stored.items():
                self._rewind(p, stored)
            for b in self._queue:  # what was polled after the store's offset comes again after the seek
                b.items = [d for d in b.items if d[0].partition not in exc.stored]
            return None
        except BaseException:
            self._queue.appendleft(w.batch)
            raise
        w.applied_s, w.applied_at = time.perf_counter(), time.time()
        self._believed.update({p: o for p, o in w.offsets.last.items() if self._believed.get(p) is not None})
        return w, applied

    def _account(self, w: _Write, applied: int) -> None:
        now = w.applied_at
        items = w.batch.items
        with self.stats.lock:
            self.stats.apply_s.observe(w.applied_s - w.started)
            for r, _ in items:
                if r.timestamp_ms is not None:
                    self.stats.age_s.observe(max(0.0, now - r.timestamp_ms / 1000))
            self.stats.applied += applied
            self.stats.consumed += len(items)
            self.stats.dead_lettered += sum(isinstance(e, InvalidEvent) for _, e in items)
            self.stats.batches += 1
        if self._on_applied is not None:
            self._on_applied([r for r, _ in items])

    def _drop_what_the_store_holds(self, batch: list[Decoded]) -> tuple[list[Decoded], dict[int, int]]:
        """The records of ``batch`` the store does not hold yet, and what it holds of their partitions
        (the offsets their write expects)."""
        unknown = {r.partition for r, _ in batch if self._believed.get(r.partition) is None}
        rewound: set[int] = set()
        if unknown:
            stored = self.store.stream_offsets(self.topic)
            for p in sorted(unknown):
                held = stored.get(p, -1)
                if min(r.offset for r, _ in batch if r.partition == p) > held + 1:
                    self._rewind(p, held)  # the stream is past a gap the store never saw: re-read it
                    rewound.add(p)
                else:
                    self._believed[p] = held
        # Every partition of the batch is known now (asked above), but a rewound one: its records come again.
        known = {p: o for p, o in self._believed.items() if o is not None and p not in rewound}
        kept = [d for d in batch if d[0].partition in known and d[0].offset > known[d[0].partition]]
        skipped = sum(1 for r, _ in batch if r.partition not in rewound) - len(kept)
        if skipped:
            with self.stats.lock:
                self.stats.skipped += skipped
        return kept, {p: known[p] for p in {r.partition for r, _ in kept}}

    def _rewind(self, partition: int, held: int) -> None:
        """Resume ``partition`` right after what the store holds."""
        log.warning("ingest: partition %d resumes from the store's offset %d", partition, held + 1)
        self.consumer.seek(partition, held + 1)  # raises (batch kept, retried) if the seek cannot be done
        if partition in self._believed:  # still ours
            self._believed[partition] = held
        with self.stats.lock:
            self.stats.rewinds += 1

    def _send_dead_letters(self, batch: list[Decoded]) -> None:  # before the offsets covering them are written
        dead = []
        for r, e in batch:
            if isinstance(e, InvalidEvent):
                source = f"{self.topic}/{r.partition}/{r.offset}"
                headers = (*r.headers, (ERROR_HEADER, str(e).encode()), (SOURCE_HEADER, source.encode()))
                log.warning("dead-lettered %s: %s", source, e)
                dead.append(OutgoingRecord(r.value, r.key, headers))
        if dead:
            self._dead.publish_raw(dead)

    # -------------------------------------------------------------- group membership and commits
    def assigned(self, partitions: set[int]) -> None:
        for p in partitions:
            self._believed[p] = None  # asked of the store before its first write

    def revoked(self, partitions: set[int]) -> None:
        for p in partitions:
            self._believed.pop(p, None)
            self._committed.pop(p, None)
        for b in self._queue:  # the new owner resumes them from the store's offsets
            b.items = [d for d in b.items if d[0].partition not in partitions]

    def _maybe_commit(self) -> None:
        if time.monotonic() - self._last_commit >= self._commit_interval_s:
            self._commit()

    def _commit(self, force: bool = False) -> None:
        """Tell the group how far we are (a hint for restarts and lag tools; the store is the truth)."""
        self._last_commit = time.monotonic()
        due = {p: o + 1 for p, o in self._believed.items() if o is not None and o >= 0
               and self._committed.get(p) != o + 1}
        try:
            self._update_lag()
            if due:
                self.consumer.commit(due)
                self._committed.update(due)
        except StreamUnavailable as exc:  # the next commit carries the same positions
            log.warning("ingest: commit failed (%s)%s", exc, "" if not force else " at shutdown")

    def _update_lag(self) -> None:
        ends = self.consumer.highwaters()
        applied = {p: -1 if o is None else o for p, o in self._believed.items()}
        with self.stats.lock:
            self.stats.lag = {p: max(0, end - applied[p] - 1) for p, end in ends.items() if p in applied}


def _decode(record: Record) -> BehaviourEvent | InvalidEvent:
    try:
        return BehaviourEvent.from_bytes(record.value)
    except InvalidEvent as exc:
        return exc


def run_ingest(stream: EventStream, store: OnlineStore, group: str, *, stop: threading.Event | None = None,
               max_records: int | None = None, idle_exit_s: float | None = None,
               poll_timeout_s: float = 0.5) -> IngestStats:
    """Run an :class:`Ingestor` until it stops, then leave the group."""
    ingestor = Ingestor(stream, store, group)
    try:
        return ingestor.run(stop, max_records=max_records, idle_exit_s=idle_exit_s, poll_timeout_s=poll_timeout_s)
    finally:
        ingestor.close()

