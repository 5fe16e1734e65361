"""One contract, every backend: the in-process stream and a real Kafka broker (KRaft)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from feature_store.ingest import run_ingest
from feature_store.online.memory import MemoryStore
from feature_store.schema import BehaviourEvent
from feature_store.streams.inprocess import InProcessStream
from feature_store.streams.kafka_stream import KafkaStream


@pytest.fixture(params=["inprocess", "kafka"])
def stream(request, unique):
    if request.param == "inprocess":
        s = InProcessStream()
    else:
        s = KafkaStream(request.getfixturevalue("kafka_bootstrap"), topic=unique)
    yield s
    s.close()


def events(n: int, start: int = 0) -> list[BehaviourEvent]:
    return [BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 3}", item_id=f"i{i}", ts=1000.0 + i)
            for i in range(start, start + n)]


def poll_all(consumer, want: int, rounds: int = 40):
    got = []
    for _ in range(rounds):
        got += consumer.poll(max_records=500, timeout_s=0.5)
        if len(got) >= want:
            break
    return got


def test_published_events_arrive_as_the_same_events(stream):
    sent = events(10)
    stream.publish(sent)
    c = stream.consumer("g1")
    got = poll_all(c, 10)
    key = lambda e: e.event_id  # noqa: E731
    assert sorted((BehaviourEvent.from_bytes(r.value) for r in got), key=key) == sorted(sent, key=key)
    c.close()


def test_uncommitted_records_are_redelivered_committed_are_not(stream):
    stream.publish(events(4))
    c = stream.consumer("g")
    assert len(poll_all(c, 4)) == 4
    c.close()  # no commit: a new member of the group starts again from the beginning
    c = stream.consumer("g")
    assert len(poll_all(c, 4)) == 4
    c.commit()
    c.close()
    stream.publish(events(2, start=4))
    c = stream.consumer("g")
    got = poll_all(c, 2)
    assert sorted(BehaviourEvent.from_bytes(r.value).event_id for r in got) == ["e4", "e5"]
    c.close()


def test_ingest_writes_valid_events_and_dead_letters_bad_ones(stream, tmp_path):
    stream.publish(events(5))
    if isinstance(stream, InProcessStream):
        stream.publish_raw([b"{broken", b'{"user_id": "u", "item_id": "i"}'])
    else:
        stream.publish_raw([(None, b"{broken"), (b"u", b'{"user_id": "u", "item_id": "i"}')])
    store = MemoryStore(history_cap=10)
    dead = tmp_path / "dead.jsonl"
    consumer = stream.consumer("ingest")
    stats = run_ingest(consumer, store, max_records=7, idle_exit_s=20, dead_letter_path=dead)
    consumer.close()
    assert (stats.consumed, stats.stored, stats.invalid) == (7, 5, 2)
    assert [h.item_id for h in store.history("u0", 10)] == ["i0", "i3"]
    lines = dead.read_text().splitlines()
    assert len(lines) == 2 and "ts" in lines[1]


UNREACHABLE = '''
from feature_store.errors import StreamUnavailable
from feature_store.schema import BehaviourEvent
from feature_store.streams.kafka_stream import KafkaStream
try:
    KafkaStream("127.0.0.1:1", topic="t", request_timeout_ms=1000).publish(
        [BehaviourEvent(user_id="u", item_id="i", ts=1.0)])
except StreamUnavailable as exc:
    print("StreamUnavailable:", exc)
'''


def test_unreachable_broker_raises_the_projects_error():
    # In a child process: kafka-python leaks its sockets when a client fails to bootstrap.
    out = subprocess.run([sys.executable, "-c", UNREACHABLE], capture_output=True, text=True, timeout=60)
    assert "StreamUnavailable: kafka not reachable at 127.0.0.1:1" in out.stdout, out.stderr
