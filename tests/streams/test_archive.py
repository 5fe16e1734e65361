"""The event archive writes every record of the stream exactly once, to time-partitioned files,
even when its consumer group has lost or never had its offsets (the files are its offsets)."""

from __future__ import annotations

from collections import Counter

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.storage.local import LocalStorage
from dinrec.streams.archive import Archiver, archived_offsets, read_archive
from dinrec.streams.kafka_stream import KafkaStream


def events(n: int, start: int = 0) -> list[BehaviourEvent]:
    return [BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 7}", item_id=f"i{i}", ts=1.7e9 + i,
                           event_type="impression" if i % 5 == 0 else "click") for i in range(start, start + n)]


def produced_when_they_happened(evs: list[BehaviourEvent], delay_s: float = 0.0) -> list:
    """The records a live stream would have carried: each produced ``delay_s`` after it happened."""
    from dinrec.streams.base import OutgoingRecord, event_record

    return [OutgoingRecord(r.value, r.key, r.headers, int((e.ts + delay_s) * 1000))
            for e, r in ((e, event_record(e)) for e in evs)]


def test_every_record_is_archived_once_whatever_the_group_remembers(stream, tmp_path):
    stream.publish(events(500))
    first = Archiver(stream, tmp_path, "archive-a", max_file_records=64)
    try:
        stats = first.run(max_records=200, idle_exit_s=10)
    finally:
        first.close()
    assert stats.records == 200 and stats.files >= 200 // 64
    stream.publish(events(300, start=500))
    # A member with no committed offsets at all — as after a crash between writing a file and
    # committing — resumes from the files, not from the start of the topic.
    second = Archiver(stream, tmp_path, "archive-b", max_file_records=64)
    try:
        stats = second.run(idle_exit_s=3)
    finally:
        second.close()
    assert stats.records == 600
    lines = read_archive(tmp_path, stream.topic)
    ids = Counter(BehaviourEvent.from_bytes(line).event_id for line in lines)
    assert len(lines) == 800 and set(ids) == {f"e{i}" for i in range(800)} and max(ids.values()) == 1
    kinds = Counter(BehaviourEvent.from_bytes(line).event_type for line in lines)
    assert kinds == {"impression": 160, "click": 640}  # impressions are archived too: training data
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    assert all(f.parts[0] == stream.topic and f.parts[1].startswith("date=") and f.parts[2].startswith("hour=")
               for f in files)
    assert not list(tmp_path.rglob(".*.tmp"))  # no half-written file left behind
    assert sum(last + 1 for last in archived_offsets(tmp_path, stream.topic).values()) == 800


@pytest.mark.kafka
def test_the_archive_command_drains_the_topic_once(kafka_bootstrap, unique, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    kafka = KafkaStream(kafka_bootstrap, topic=unique)
    kafka.ensure_topic(2)
    kafka.publish(events(120))
    env = {**os.environ, "DINREC_STREAM": "kafka", "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique}

    def archive() -> dict:
        out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "ingest", "archive", "--out", str(tmp_path),
                              "--idle-exit", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    assert archive()["records"] == 120
    assert archive()["records"] == 0  # run again: nothing is archived twice
    assert len(read_archive(tmp_path, unique)) == 120
    kafka.close()


def test_the_archive_on_s3_writes_each_record_once_and_retraining_reads_it(aws_env, unique):
    import boto3

    from dinrec.retrain.events import read_window
    from dinrec.storage import open_storage
    from dinrec.streams.inprocess import InProcessStream

    boto3.client("s3").create_bucket(Bucket=unique)
    root = f"s3://{unique}/archive"
    stream = InProcessStream()
    stream.publish_raw(produced_when_they_happened(events(300)))
    for group in ("a", "b"):  # the second member has no offsets: it resumes from the objects
        archiver = Archiver(stream, root, group, max_file_records=64)
        try:
            archiver.run(max_records=150 if group == "a" else None, idle_exit_s=2)
        finally:
            archiver.close()
    keys = [k for k in open_storage(root).keys(f"{stream.topic}/") if "/_highwater/" not in k]
    assert keys and all("/date=" in k and "/hour=" in k for k in keys)
    assert sum(last + 1 for last in archived_offsets(root, stream.topic).values()) == 300
    window = read_window(root, stream.topic, 1.7e9, 1.7e9 + 200)
    assert window.stats["events"] == 200 and window.stats["outside_window"] == 100
    assert window.stats["behaviours"] == 160  # every fifth event is an impression
    stream.close()


class CountingStorage(LocalStorage):
    """A folder that counts what is read and listed."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.gets: list[str] = []
        self.lists: list[str] = []

    def get_bytes(self, key):
        self.gets.append(key)
        return super().get_bytes(key)

    def keys(self, prefix):
        self.lists.append(prefix)
        return super().keys(prefix)


def test_a_window_reads_its_hours_and_late_events_within_the_margin(tmp_path):
    from dinrec.retrain.events import read_window
    from dinrec.streams.inprocess import InProcessStream

    day = 86_400
    t0 = 1.7e9 - 1.7e9 % day
    # Ten days of events, one every 10 minutes; the window is the last day.
    evs = [BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 7}", item_id=f"i{i % 40}", ts=t0 + 600 * i)
           for i in range(10 * 144)]
    start, end = t0 + 9 * day, t0 + 10 * day
    # Two late ones: produced an hour after the window (read) and two days after (not).
    late = [BehaviourEvent(event_id="late", user_id="u1", item_id="i1", ts=end - 10),
            BehaviourEvent(event_id="very-late", user_id="u1", item_id="i2", ts=end - 20)]
    stream = InProcessStream()
    stream.publish_raw(produced_when_they_happened(evs) + produced_when_they_happened(late[:1], 3600)
                       + produced_when_they_happened(late[1:], 2 * day))
    archiver = Archiver(stream, tmp_path)
    archiver.run(max_records=len(evs) + 2, idle_exit_s=2)
    archiver.close()
    storage = CountingStorage(tmp_path)
    window = read_window(storage, "dinrec.events", start, end, late_s=6 * 3600)
    ids = set(window.data.item_id.tolist())
    assert window.stats["events"] == 144 + 1 and "i1" in ids  # the window's day, and the one late by an hour
    files = [k for k in storage.gets if k.endswith(".jsonl")]
    assert len(files) <= 24 + 6 + 2  # the window's hours (+ the margins), not the 240 hours of the archive
    assert all("date=" in p for p in storage.lists)  # listed by day, never the whole topic


def test_the_archiver_resumes_from_its_high_water_record_without_listing(tmp_path):
    from dinrec.streams.archive import _high_water_key, high_water
    from dinrec.streams.inprocess import InProcessStream

    stream = InProcessStream()
    stream.publish_raw(produced_when_they_happened(events(100)))
    storage = CountingStorage(tmp_path)
    first = Archiver(stream, storage, "a", max_file_records=30)
    first.run(max_records=100, idle_exit_s=2)
    first.close()
    assert high_water(storage, stream.topic, 0) == 99
    storage.lists.clear()
    stream.publish_raw(produced_when_they_happened(events(20, start=100)))
    second = Archiver(stream, storage, "b", max_file_records=30)  # a new group: no committed offsets
    stats = second.run(max_records=20, idle_exit_s=2)
    second.close()
    assert stats.records == 20 and stats.redelivered == 0 and storage.lists == []  # sought past the record, no listing
    # An archiver that died after naming a file as pending: the file decides.
    key = _high_water_key(stream.topic, 0)
    storage.put_json(key, {"archived": 119, "pending": {"last": 150, "key": f"{stream.topic}/never-written.jsonl"}})
    assert high_water(storage, stream.topic, 0) == 119
    written = next(k for k in storage.keys(f"{stream.topic}/") if k.endswith("-000000000119.jsonl"))
    storage.put_json(key, {"archived": 99, "pending": {"last": 119, "key": written}})
    assert high_water(storage, stream.topic, 0) == 119
