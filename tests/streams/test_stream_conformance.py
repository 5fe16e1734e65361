"""One contract, every backend: the in-process stream and a real Kafka broker (KRaft)."""

from __future__ import annotations

import time

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.ingest import ERROR_HEADER, SOURCE_HEADER, run_ingest
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.streams.base import OutgoingRecord
from dinrec.streams.errors import StreamUnavailable
from dinrec.streams.kafka_stream import KafkaStream


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
    got = poll_all(c, 4)
    assert len(got) == 4
    c.close()  # no commit: a new member of the group starts again from the beginning
    c = stream.consumer("g")
    got = poll_all(c, 4)
    assert len(got) == 4
    c.commit({p: max(r.offset for r in got if r.partition == p) + 1 for p in {r.partition for r in got}})
    c.close()
    stream.publish(events(2, start=4))
    c = stream.consumer("g")
    got = poll_all(c, 2)
    assert sorted(BehaviourEvent.from_bytes(r.value).event_id for r in got) == ["e4", "e5"]
    c.close()


def test_seek_rereads_from_an_offset_and_assignment_is_reported(stream):
    stream.publish(events(6))
    assigned: list[set[int]] = []
    c = stream.consumer("g", on_assigned=assigned.append)
    got = poll_all(c, 6)
    assert len(got) == 6 and assigned and set().union(*assigned) == {r.partition for r in got}
    p = got[0].partition
    in_p = sorted(r.offset for r in got if r.partition == p)
    c.seek(p, in_p[1])
    again = poll_all(c, len(in_p) - 1)
    assert sorted(r.offset for r in again if r.partition == p) == in_p[1:]
    assert c.highwaters()[p] == in_p[-1] + 1
    assert stream.end_offsets()[p] == in_p[-1] + 1
    c.close()


def test_keys_and_headers_travel_with_the_record(stream):
    stream.publish_raw([OutgoingRecord(b"payload", key=b"k1", headers=(("h", b"v"),))])
    c = stream.consumer("g")
    (r,) = poll_all(c, 1)
    assert (r.value, r.key, r.headers) == (b"payload", b"k1", (("h", b"v"),))
    c.close()


def test_ingest_writes_valid_events_and_dead_letters_bad_ones(stream):
    stream.publish(events(5))
    stream.publish_raw([OutgoingRecord(b"{broken"), OutgoingRecord(b'{"user_id": "u", "item_id": "i"}', key=b"u")])
    store = MemoryStore(history_cap=10)
    stats = run_ingest(stream, store, "ingest", max_records=7, idle_exit_s=20)
    assert (stats.consumed, stats.applied, stats.dead_lettered) == (7, 5, 2)
    assert [h.item_id for h in store.history("u0", 10)] == ["i0", "i3"]
    c = stream.dead_letters().consumer("dlq-reader")
    dead = poll_all(c, 2)
    c.close()
    assert sorted(r.value for r in dead) == [b'{"user_id": "u", "item_id": "i"}', b"{broken"]
    reasons = {r.value: dict(r.headers) for r in dead}
    assert b"ts" in reasons[b'{"user_id": "u", "item_id": "i"}'][ERROR_HEADER]
    assert reasons[b"{broken"][SOURCE_HEADER].startswith(stream.topic.encode() + b"/")
    # The store knows how far it got: a second run finds nothing new to apply.
    assert sum(store.stream_offsets(stream.topic).values()) + len(store.stream_offsets(stream.topic)) == 7
    again = run_ingest(stream, store, "another-group", idle_exit_s=3)
    assert (again.applied, again.dead_lettered, again.skipped) == (0, 0, 7)


def test_unreachable_broker_raises_the_projects_error():
    started = time.monotonic()
    with pytest.raises(StreamUnavailable, match="kafka publish to 't' at 127.0.0.1:1 failed"):
        KafkaStream("127.0.0.1:1", topic="t", request_timeout_ms=1000).publish(
            [BehaviourEvent(user_id="u", item_id="i", ts=1.0)])
    assert time.monotonic() - started < 10  # bounded by the request timeout, not a hang


@pytest.mark.kafka
def test_security_settings_reach_every_kafka_client_and_other_keys_are_refused(kafka_bootstrap, unique,
                                                                               monkeypatch):
    from pydantic import ValidationError

    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.streams import open_stream

    with pytest.raises(ValidationError, match="only security"):
        FeatureStoreSettings(kafka_security={"group.id": "hijack"})
    monkeypatch.setenv("DINREC_KAFKA_SECURITY", '{"security.protocol": "PLAINTEXT", "ssl.key.password": "pw-123"}')
    settings = FeatureStoreSettings(stream="kafka", kafka_bootstrap=kafka_bootstrap, topic=unique)
    assert "pw-123" not in repr(settings)  # secret in logs and errors
    stream = open_stream(settings)
    dead = stream.dead_letters()
    assert isinstance(stream, KafkaStream) and isinstance(dead, KafkaStream)
    assert stream._conf()["security.protocol"] == "PLAINTEXT"
    assert dead._conf()["ssl.key.password"] == "pw-123"  # siblings get it too
    stream.ensure_topic(1)
    stream.publish(events(2))  # the broker is plaintext: the settings were taken, and they work
    consumer = stream.consumer("sec")
    assert len(poll_all(consumer, 2)) == 2
    consumer.close()
    stream.close()
