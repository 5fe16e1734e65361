"""The event archive writes every record of the stream exactly once, to time-partitioned files,
even when its consumer group has lost or never had its offsets (the files are its offsets)."""

from __future__ import annotations

from collections import Counter

import pytest

from feature_store.archive import Archiver, archived_offsets, read_archive
from feature_store.schema import BehaviourEvent
from feature_store.streams.kafka_stream import KafkaStream


def events(n: int, start: int = 0) -> list[BehaviourEvent]:
    return [BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 7}", item_id=f"i{i}", ts=1.7e9 + i,
                           event_type="impression" if i % 5 == 0 else "click") for i in range(start, start + n)]


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
        out = subprocess.run([sys.executable, "-m", "dinrec_cli.main", "ingest", "archive", "--out", str(tmp_path),
                              "--idle-exit", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    assert archive()["records"] == 120
    assert archive()["records"] == 0  # run again: nothing is archived twice
    assert len(read_archive(tmp_path, unique)) == 120
    kafka.close()


def test_the_archive_on_s3_writes_each_record_once_and_retraining_reads_it(aws_env, unique):
    import boto3

    from feature_store.streams.inprocess import InProcessStream
    from retrain.events import read_window
    from storage import open_storage

    boto3.client("s3").create_bucket(Bucket=unique)
    root = f"s3://{unique}/archive"
    stream = InProcessStream()
    stream.publish(events(300))
    for group in ("a", "b"):  # the second member has no offsets: it resumes from the objects
        archiver = Archiver(stream, root, group, max_file_records=64)
        try:
            archiver.run(max_records=150 if group == "a" else None, idle_exit_s=2)
        finally:
            archiver.close()
    keys = open_storage(root).keys(f"{stream.topic}/")
    assert keys and all("/date=" in k and "/hour=" in k for k in keys)
    assert sum(last + 1 for last in archived_offsets(root, stream.topic).values()) == 300
    window = read_window(root, stream.topic, 1.7e9, 1.7e9 + 200)
    assert window.stats["events"] == 200 and window.stats["outside_window"] == 100
    assert window.stats["behaviours"] == 160  # every fifth event is an impression
    stream.close()
