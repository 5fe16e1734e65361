"""The partitioned consumer loop (streams.consuming) behind ingestion and the archive: an outage of
what a sink writes to is waited out with backoff, the records in hand kept, and every record still
ends up written exactly once; idleness and ``max_records`` settle what is held before the run ends."""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.feature_store.ingest import Ingestor
from dinrec.feature_store.online.base import StreamOffsets
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.storage.aws import CloudError
from dinrec.storage.local import LocalStorage
from dinrec.storage.loops import Backoff
from dinrec.streams.archive import Archiver, high_water, read_archive
from dinrec.streams.base import OutgoingRecord, Record, event_record
from dinrec.streams.consuming import ConsumerLoop, PartitionedSink
from dinrec.streams.inprocess import InProcessStream

QUICK = Backoff(initial_s=0.001, max_s=0.01)  # the retries' waits, short enough for a test


def events(n: int, every_s: float = 30.0) -> list[BehaviourEvent]:
    """``n`` events ``every_s`` apart: 500 of them span five hours, so the archive's files change hour."""
    return [BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 7}", item_id=f"i{i}", ts=1.7e9 + every_s * i)
            for i in range(n)]


def produced_when_they_happened(evs: list[BehaviourEvent]) -> list[OutgoingRecord]:
    return [OutgoingRecord(r.value, r.key, r.headers, int(e.ts * 1000)) for e, r in ((e, event_record(e)) for e in evs)]


class FlakyStorage(LocalStorage):
    """A folder that answers as a throttled or unreachable S3 does (a transient CloudError) when
    ``fails(n)`` says so of its n-th call (reads and writes counted together); ``on_failure`` is told
    how many have failed."""

    def __init__(self, root: Path, fails: Callable[[int], bool], on_failure: Callable[[int], object] = lambda n: None):
        super().__init__(root)
        self.fails, self.on_failure = fails, on_failure
        self.calls = self.failures = 0

    def _call(self, what: str, key: str) -> None:
        self.calls += 1
        if self.fails(self.calls):
            self.failures += 1
            self.on_failure(self.failures)
            raise CloudError(f"s3 {what} {self.child_uri(key)}: SlowDown: Please reduce your request rate.",
                             "SlowDown", transient=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("put", key)
        super().put_bytes(key, data)

    def get_bytes(self, key: str) -> bytes | None:
        self._call("get", key)
        return super().get_bytes(key)


def archived_ids(root: Path, topic: str) -> Counter[str]:
    return Counter(BehaviourEvent.from_bytes(line).event_id for line in read_archive(root, topic))


def test_the_archive_waits_out_a_storage_outage_and_archives_each_record_once(tmp_path):
    stream = InProcessStream()
    sent = events(500)
    stream.publish_raw(produced_when_they_happened(sent))
    draw = random.Random(7)  # half of the first 150 calls fail: before, between and after a file's three writes
    storage = FlakyStorage(tmp_path, lambda n: n <= 150 and draw.random() < 0.5)
    archiver = Archiver(stream, storage, max_file_records=64, backoff=QUICK)
    try:
        stats = archiver.run(max_records=500, idle_exit_s=10)
    finally:
        archiver.close()
    assert storage.failures >= 30 and stats.retries == storage.failures  # each one waited out, none raised
    assert stats.records == 500
    ids = archived_ids(tmp_path, stream.topic)
    assert set(ids) == {e.event_id for e in sent} and max(ids.values()) == 1
    assert high_water(storage, stream.topic, 0) == 499
    for path in tmp_path.rglob("*.jsonl"):  # a file holds one hour (by produce time) and at most 64 records
        m = re.search(r"date=(\S+)/hour=(\d\d)/", path.as_posix())
        assert m is not None
        lines = path.read_bytes().splitlines()
        hours = {datetime.fromtimestamp(BehaviourEvent.from_bytes(line).ts, UTC).strftime("%Y-%m-%d %H")
                 for line in lines}
        assert hours == {f"{m.group(1)} {m.group(2)}"} and 0 < len(lines) <= 64
    stream.close()


def test_a_stop_during_an_outage_leaves_the_rest_to_the_next_archiver_and_nothing_twice(tmp_path):
    stream = InProcessStream()
    sent = events(300)
    stream.publish_raw(produced_when_they_happened(sent))
    stop = threading.Event()
    # S3 goes away for good after 16 calls (between the fifth file and its high-water record); the operator
    # stops the archiver meanwhile.
    def stop_after_five(failures: int) -> None:
        if failures >= 5:
            stop.set()

    storage = FlakyStorage(tmp_path, lambda n: n > 16, on_failure=stop_after_five)
    first = Archiver(stream, storage, "a", max_file_records=30, backoff=QUICK)
    try:
        stats = first.run(stop, idle_exit_s=10)  # returns: what it held is redelivered, not raised
    finally:
        first.close()
    assert 0 < stats.records < 300 and stats.retries == 5
    second = Archiver(stream, tmp_path, "b", max_file_records=30)  # another group: it resumes from the files
    try:
        again = second.run(idle_exit_s=1)
    finally:
        second.close()
    ids = archived_ids(tmp_path, stream.topic)
    assert set(ids) == {e.event_id for e in sent} and max(ids.values()) == 1
    # The fifth file is written but its high-water record is not: neither counts it, the second finds it
    # named as pending (and there) and reads on after it.
    assert 0 < again.records < 300 - stats.records and again.redelivered == 0
    stream.close()


class FlakyStore(MemoryStore):
    """An online store whose first ``failing`` writes find it unreachable."""

    def __init__(self, failing: int) -> None:
        super().__init__()
        self.failing = failing

    def write(self, events, offsets: StreamOffsets | None = None) -> int:
        if self.failing > 0:
            self.failing -= 1
            raise StoreUnavailable("redis: connection refused")
        return super().write(events, offsets)


def test_ingestion_waits_out_a_store_outage_on_the_shared_loop():
    stream, store = InProcessStream(), FlakyStore(failing=3)
    stream.publish([BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 7}", item_id=f"i{i}", ts=1000.0 + i)
                    for i in range(100)])
    ingestor = Ingestor(stream, store, "g", batch_size=10, backoff=QUICK)
    try:
        stats = ingestor.run(max_records=100)
    finally:
        ingestor.close()
    assert (stats.consumed, stats.applied, stats.retries) == (100, 100, 3)
    assert store.stream_offsets(stream.topic) == {0: 99}
    stream.close()


class HoldingSink(PartitionedSink):
    """Holds what it takes until the loop says it is finishing; ``fail`` raises from its work."""

    name = "holding"

    def __init__(self) -> None:
        self.held: list[Record] = []
        self.done: list[Record] = []
        self.drained: list[Record] = []
        self.fail: Exception | None = None

    def assigned(self, partitions: set[int]) -> None:
        pass

    def revoked(self, partitions: set[int]) -> None:
        pass

    def wanted(self) -> int:
        return 4

    def accept(self, records: list[Record]) -> None:
        self.held += records

    def work(self, finishing: bool) -> None:
        if self.fail is not None:
            raise self.fail
        if finishing:
            self.done, self.held = self.done + self.held, []

    def in_hand(self) -> int:
        return len(self.held)

    def settled(self) -> int:
        return len(self.done)

    def drain(self) -> None:
        self.drained, self.held = self.held, []


@pytest.mark.parametrize("ends_by", ["max_records", "idleness"])
def test_the_loop_settles_what_the_sink_holds_before_it_ends(ends_by):
    stream = InProcessStream()
    stream.publish_raw([OutgoingRecord(f"{i}".encode()) for i in range(10)])
    sink = HoldingSink()
    loop = ConsumerLoop(stream, "g", sink)
    try:
        if ends_by == "max_records":
            loop.run(max_records=7)
        else:
            loop.run(idle_exit_s=0.2, poll_timeout_s=0.05)
    finally:
        loop.close()
    want = 7 if ends_by == "max_records" else 10
    assert [r.value for r in sink.done] == [f"{i}".encode() for i in range(want)] and sink.drained == []
    stream.close()


def test_an_error_the_sink_does_not_call_an_outage_ends_the_run():
    stream = InProcessStream()
    stream.publish_raw([OutgoingRecord(b"x")])
    sink = HoldingSink()
    sink.fail = ValueError("a bug, not an outage")
    loop = ConsumerLoop(stream, "g", sink, backoff=QUICK)
    try:
        with pytest.raises(ValueError, match="a bug"):
            loop.run(max_records=1)
    finally:
        loop.close()
    stream.close()
