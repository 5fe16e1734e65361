"""The event archive: the stream, written to time-partitioned JSON-lines files, each record once.

Kafka keeps events for its retention period; training data of record must outlive it. An
:class:`Archiver` is its own consumer group on the topic (behaviours, impressions, clicks: every
record as it was published) and writes what it reads, per partition, to files::

    {root}/{topic}/date=YYYY-MM-DD/hour=HH/p{partition}-{first:012d}-{last:012d}.jsonl

(the date and hour of the file's first record, by its produce time; one record's bytes per line).
``root`` is a folder or ``s3://bucket/prefix`` (storage): a file is one atomic write —
a temp file fsynced and renamed into place, or one PUT — so it is whole or absent. **The files
are the archive's offsets**: on assignment a partition is read from one past the highest offset any
file covers, and a redelivered record at or below it is dropped — so a crash between writing a file
and committing to the group re-reads nothing twice, whatever the group's committed offsets say.

That offset is kept in a small record per partition, ``{topic}/_highwater/p{partition}.json``, so an
assignment reads one object instead of listing the topic's whole history: before a file is written
the record names it as pending, after it the offset moves past it; an archiver that died between the
two finds the pending file there or not (one existence check). An archive without records (older
than them) is listed once and gets them.

The consuming is the shared partitioned loop (streams.consuming): an outage of the storage (S3
unreachable or throttled) or of the stream is waited out with backoff, what is buffered kept and
written again, for as long as it takes.

Readers take the hours they need (:func:`read_hours`): a retrain reads its window's hours, not the
topic's history.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dinrec.events.schema import BehaviourEvent
from dinrec.storage import Storage, open_storage
from dinrec.storage.loops import Backoff
from dinrec.storage.outage import outage
from dinrec.streams.base import EventStream, OutgoingRecord, Record, event_record
from dinrec.streams.consuming import ConsumerLoop, PartitionedSink
from dinrec.streams.errors import StreamUnavailable

log = logging.getLogger(__name__)
_FILE = re.compile(r"^p(\d+)-(\d{12})-(\d{12})\.jsonl$")


@dataclass
class ArchiveStats:
    records: int = 0
    files: int = 0
    redelivered: int = 0  # records dropped because a file already holds them
    retries: int = 0  # rounds that met an outage (the storage's or the stream's) and ran again
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def _storage(root: str | Path | Storage) -> Storage:
    return root if isinstance(root, Storage) else open_storage(root, durable=True)


def _files(storage: Storage, topic: str, prefix: str = "") -> list[tuple[int, int, int, str]]:
    """(partition, first offset, last offset, key) of every archive file of ``topic`` (under ``prefix``
    in it, e.g. ``date=2026-12-04/``)."""
    out = []
    for key in storage.keys(f"{topic}/{prefix}"):
        m = _FILE.match(key.rsplit("/", 1)[-1])
        if m:
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), key))
    return sorted(out)


def _hour(record: Record) -> int:
    """The hour of ``record``'s produce time (a live record without one: now), as hours since 1970."""
    return int((record.timestamp_ms or time.time() * 1000) // 3_600_000)


def _hour_of(key: str) -> datetime | None:
    m = re.search(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/", key)
    return datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H").replace(tzinfo=UTC) if m else None


def read_hours(root: str | Path | Storage, topic: str, start: float, end: float) -> Iterator[bytes]:
    """The archived records of ``topic`` in the files of the hours from ``start``'s to ``end``'s (by
    the produce time of a file's first record), one file at a time, by partition then offset: what a
    reader of a time window streams, whatever the length of the topic's history."""
    storage = _storage(root)
    first = datetime.fromtimestamp(start, UTC).replace(minute=0, second=0, microsecond=0)
    last = datetime.fromtimestamp(end, UTC)
    files = []
    day = first.replace(hour=0)
    while day <= last:  # one listing per day
        files += [f for f in _files(storage, topic, f"date={day:%Y-%m-%d}/")
                  if first <= (_hour_of(f[3]) or first) <= last]
        day += timedelta(days=1)
    for *_, key in sorted(files):
        yield from (line for line in (storage.get_bytes(key) or b"").split(b"\n") if line)


def _high_water_key(topic: str, partition: int) -> str:
    return f"{topic}/_highwater/p{partition}.json"


def high_water(storage: Storage, topic: str, partition: int) -> int | None:
    """The highest offset of ``partition`` the archive's files hold, from its record (None: no record)."""
    doc = storage.get_json(_high_water_key(topic, partition))
    if not isinstance(doc, dict) or not isinstance(doc.get("archived"), int):
        return None
    pending = doc.get("pending")
    if isinstance(pending, dict) and isinstance(pending.get("last"), int) and isinstance(pending.get("key"), str) \
            and storage.exists(pending["key"]):
        return pending["last"]  # written; the record's move past it did not happen
    return doc["archived"]


def archived_offsets(root: str | Path | Storage, topic: str) -> dict[int, int]:
    """Per partition, the highest offset any archive file of ``topic`` covers."""
    out: dict[int, int] = {}
    for p, _, last, _ in _files(_storage(root), topic):
        out[p] = max(out.get(p, -1), last)
    return out


def read_archive(root: str | Path | Storage, topic: str) -> list[bytes]:
    """Every archived record of ``topic``, by partition then offset (for retraining and checks)."""
    storage = _storage(root)
    out: list[bytes] = []
    for *_, key in _files(storage, topic):
        out += [line for line in (storage.get_bytes(key) or b"").split(b"\n") if line]
    return out


def archive_events(events: Sequence[BehaviourEvent], root: str | Path | Storage, topic: str = "dinrec.events", *,
                   max_file_records: int = 10_000) -> ArchiveStats:
    """Archive ``events`` as if the stream had carried them — published to an in-process stream and
    written by an :class:`Archiver` — for a replayed dataset (benchmarks) and tests."""
    from dinrec.streams.inprocess import InProcessStream

    stream = InProcessStream(topic)
    # produced when they happened, as a live stream would have carried them (the files' hours follow)
    stream.publish_raw([OutgoingRecord(r.value, r.key, r.headers, int(e.ts * 1000))
                        for e, r in ((e, event_record(e)) for e in events)])
    archiver = Archiver(stream, root, max_file_records=max_file_records)
    try:
        return archiver.run(max_records=len(events), idle_exit_s=5)
    finally:
        archiver.close()
        stream.close()


class Archiver(PartitionedSink):
    """Archives one topic as its own consumer group (see the module docstring): a sink of the shared
    consumer loop (streams.consuming), which polls, hands over the group's assignments, waits out the
    stream's and the storage's outages with backoff and decides when to stop; what is here is the
    archive's own: hour files and the high-water records.

    A write that fails is written again, whole, by a later round: its key is fixed by its records
    (partition, offsets, the first one's hour), so a retry replaces the same file and the high-water
    record's pending step covers a crash in between."""

    name = "archive"

    def __init__(self, stream: EventStream, root: str | Path | Storage, group: str = "dinrec-archive", *,
                 max_file_records: int = 10_000, max_file_age_s: float = 60.0, backoff: Backoff | None = None) -> None:
        self.stream, self.storage, self.topic = stream, _storage(root), stream.topic
        self.max_file_records, self.max_file_age_s = max_file_records, max_file_age_s
        self.stats = ArchiveStats()
        # Owned partition -> the last offset in a file, read on assignment: a record of a partition not
        # here is not archived by this member (revoked, or read from before the seek that locates it).
        self._archived: dict[int, int] = {}
        # Assigned partitions whose place in the archive is not read yet: nothing is polled until it is
        # (their records before the seek would be thrown away).
        self._to_locate: set[int] = set()
        self._buffers: dict[int, list[Record]] = {}
        self._opened: dict[int, float] = {}  # partition -> when its buffer's oldest hour got its first record
        self._behind = False  # the last flush failed: take nothing more until it succeeds (no pile-up in memory)
        self._loop = ConsumerLoop(stream, group, self, backoff=backoff)
        self.consumer = self._loop.consumer

    def run(self, stop: threading.Event | None = None, *, max_records: int | None = None,
            idle_exit_s: float | None = None, poll_timeout_s: float = 0.5) -> ArchiveStats:
        """Archive until ``stop``, ``max_records`` archived, or ``idle_exit_s`` without records; then
        write what is buffered."""
        self._loop.run(stop, max_records=max_records, idle_exit_s=idle_exit_s, poll_timeout_s=poll_timeout_s)
        return self.stats

    def close(self) -> None:
        self._loop.close()

    # -------------------------------------------------------------- the consumer loop's sink
    def assigned(self, partitions: set[int]) -> None:
        for p in partitions:  # another member may have archived more of it meanwhile: read where it ends
            self._buffers.pop(p, None)
            self._archived.pop(p, None)
            self._to_locate.add(p)

    def revoked(self, partitions: set[int]) -> None:
        for p in partitions:  # what we hold of it is re-read from the files' end by its new owner
            self._buffers.pop(p, None)
            self._to_locate.discard(p)
            self._archived.pop(p, None)

    def wanted(self) -> int:
        return 0 if self._to_locate or self._behind else 1000

    def accept(self, records: list[Record]) -> None:
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        for r in records:
            if r.partition not in self._archived:  # assigned in this poll (read from before its seek: it
                continue                            # comes again), or revoked in it (its new owner's)
            if r.offset <= self._archived[r.partition]:
                self.stats.redelivered += 1
                continue
            buf = self._buffers.setdefault(r.partition, [])
            if buf and r.offset <= buf[-1].offset:  # redelivered after a rewind: already buffered
                self.stats.redelivered += 1
                continue
            if not buf:
                self._opened[r.partition] = now
            # A live record without a produce time is filed under the hour it arrived, the same on every
            # retry of its write.
            buf.append(r if r.timestamp_ms is not None else r._replace(timestamp_ms=now_ms))

    def work(self, finishing: bool) -> None:
        self._locate()
        self._behind = True
        self._flush(force=finishing)
        self._behind = False

    def in_hand(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def settled(self) -> int:
        return self.stats.records

    def drain(self) -> None:
        self._flush(force=True)

    def is_transient(self, exc: Exception) -> bool:
        # The storage's (a transient CloudError: S3 unreachable, throttled, a 5xx) or any other dependency's,
        # also as the cause of another error.
        return outage(exc) is not None

    def retried(self, exc: Exception) -> None:
        with self.stats.lock:
            self.stats.retries += 1

    # -------------------------------------------------------------- files
    def _locate(self) -> None:
        """Seek each newly assigned partition to one past the end of its archive (its high-water record;
        an archive from before the records is listed once and given them)."""
        listed: dict[int, int] | None = None
        for p in sorted(self._to_locate):
            found = high_water(self.storage, self.topic, p)
            if found is None:
                listed = listed if listed is not None else archived_offsets(self.storage, self.topic)
                found = listed.get(p, -1)
                self.storage.put_json(_high_water_key(self.topic, p), {"archived": found, "pending": None})
            self._archived[p] = found
            self.consumer.seek(p, found + 1)
            self._to_locate.discard(p)  # only now: a failure above locates it again next round

    def _flush(self, force: bool) -> None:
        """Write each partition's finished hours, and its open hour too if it is full, old or ``force``d:
        a file holds one hour, at most ``max_file_records`` records. Each file leaves the buffer as soon
        as it is written, so a failure (raised) leaves only what is unwritten, for the next round."""
        now = time.monotonic()
        for p, buf in list(self._buffers.items()):
            while buf:
                hour = _hour(buf[0])
                run = next((i for i, r in enumerate(buf) if _hour(r) != hour), len(buf))  # records of buf[0]'s hour
                if run == len(buf) and not (force or run >= self.max_file_records
                                            or now - self._opened[p] >= self.max_file_age_s):
                    break  # the open hour: it may get more records
                for start in range(0, run, self.max_file_records):
                    chunk = buf[:min(run - start, self.max_file_records)]
                    self._write(p, chunk)
                    buf = self._buffers[p] = buf[len(chunk):]
                self._opened[p] = now  # the next hour's file opens (as it did when its first record came)

    def _write(self, partition: int, records: list[Record]) -> None:
        first, last = records[0].offset, records[-1].offset
        ts = (records[0].timestamp_ms or int(time.time() * 1000)) / 1000
        when = datetime.fromtimestamp(ts, UTC)
        key = f"{self.topic}/date={when:%Y-%m-%d}/hour={when:%H}/p{partition}-{first:012d}-{last:012d}.jsonl"
        mark = _high_water_key(self.topic, partition)
        self.storage.put_json(mark, {"archived": self._archived.get(partition, -1),
                                     "pending": {"last": last, "key": key}})
        self.storage.put_bytes(key, b"".join(r.value.rstrip(b"\n") + b"\n" for r in records))
        # the file is the record that these offsets are archived; the mark says so without a listing
        self.storage.put_json(mark, {"archived": last, "pending": None})
        self._archived[partition] = last
        with self.stats.lock:
            self.stats.records += len(records)
            self.stats.files += 1
        log.info("archive: %s (%d records)", self.storage.child_uri(key), len(records))
        try:
            self.consumer.commit({partition: last + 1})  # a hint for lag tools; the files are the truth
        except StreamUnavailable as exc:  # the next file's commit carries the position
            log.warning("archive: commit failed (%s)", exc)
