"""`dinrec ingest`, `dinrec ingest dlq` and `dinrec ingest status` as an operator runs them, on a real
broker and Redis: bad input of every kind ends in the dead-letter topic with its reason, the good
events around it are applied, and a replay sends each dead letter back once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.ingest import Ingestor
from dinrec.feature_store.ingest_http import serve_stats
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.streams.base import OutgoingRecord
from dinrec.streams.inprocess import InProcessStream
from dinrec.streams.kafka_stream import KafkaStream
from tests.conftest import REPO

GOOD = b'{"user_id": "u1", "item_id": "i1", "ts": 5}'
# (what is wrong, the record, a phrase its dead-letter reason must contain)
MALFORMED = [
    ("bad json", b'{"user_id": "u1", "item_id":', "Invalid JSON"),
    ("missing field", b'{"user_id": "u1", "ts": 5}', "item_id: Field required"),
    ("wrong type", b'{"user_id": "u1", "item_id": "i1", "ts": "yesterday"}', "ts: Input should be a valid number"),
    ("unknown type", b'{"user_id": "u1", "item_id": "i1", "ts": 5, "event_type": "like"}', "event_type"),
    ("absurd ts", b'{"user_id": "u1", "item_id": "i1", "ts": 99999999999}', "ts: Input should be less than"),
    ("non-finite ts", b'{"user_id": "u1", "item_id": "i1", "ts": NaN}', "ts:"),
    ("negative ts", b'{"user_id": "u1", "item_id": "i1", "ts": -1}', "ts: Input should be greater than"),
    ("oversized", GOOD[:-1] + b', "variant": "' + b"v" * 40_000 + b'"}', "oversized"),
    ("invalid utf-8", b'{"user_id": "u1\xff\xfe", "item_id": "i1", "ts": 5}', "invalid unicode"),
    ("control character", b'{"user_id": "u1", "item_id": "i\\u001f1", "ts": 5}', "item_id: must not contain control"),
    ("not an object", b'[1, 2, 3]', "Input should be an object"),
    ("empty", b"", "Invalid JSON"),
]


def good_events(n: int) -> list[BehaviourEvent]:
    return [BehaviourEvent(event_id=f"g{i}", user_id=f"u{i % 7}", item_id=f"i{i % 5}", ts=1000.0 + i) for i in range(n)]


def dinrec(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.kafka
@pytest.mark.redis
def test_every_kind_of_bad_record_is_dead_lettered_and_the_good_ones_applied(redis_url, kafka_bootstrap, unique):
    stream = KafkaStream(kafka_bootstrap, unique)
    stream.ensure_topic(4)
    good = good_events(40)
    records = []
    for i, e in enumerate(good):  # the bad ones sit between good ones, in the same partitions
        records.append(OutgoingRecord(e.to_bytes(), key=e.user_id.encode()))
        if i < len(MALFORMED):
            records.append(OutgoingRecord(MALFORMED[i][1], key=e.user_id.encode()))
    stream.publish_raw(records)
    env = {**os.environ, "DINREC_STORE": "redis", "DINREC_STREAM": "kafka", "DINREC_REDIS_URL": redis_url,
           "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique, "DINREC_REDIS_PREFIX": unique,
           "DINREC_CONSUMER_GROUP": f"{unique}-ingest"}
    store = RedisStore(redis_url, prefix=unique)
    try:
        stats = json.loads(dinrec(env, "ingest", "--idle-exit", "3").stdout.splitlines()[-1])
        assert (stats["consumed"], stats["applied"], stats["dead_lettered"]) == (len(records), 40, len(MALFORMED))
        assert store.applied_behaviours() == 40
        assert [h.event_id for h in store.history("u0", 100)] == [e.event_id for e in good if e.user_id == "u0"]

        shown = dinrec(env, "ingest", "dlq", "--json", "--limit", "100").stdout
        rows = [json.loads(line) for line in shown.splitlines()]
        assert len(rows) == len(MALFORMED)
        by_value = {r["value"].encode(errors="replace")[:60]: r for r in rows}
        for what, raw, phrase in MALFORMED:
            row = by_value[raw.decode(errors="replace").encode(errors="replace")[:60]]
            assert phrase in row["error"], (what, row["error"])
            assert row["bytes"] == len(raw) and row["source"].startswith(f"{unique}/")

        status = json.loads(dinrec(env, "ingest", "status", "--json").stdout)
        assert status["lag"] == 0 and status["dead_letters"] == len(MALFORMED) and status["eviction"] is None
        assert set(status["partitions"]) == {"0", "1", "2", "3"}

        # Replay after a "fix" (here none: they fail again and come back once more, not in a loop).
        assert json.loads(dinrec(env, "ingest", "dlq", "--replay").stdout)["replayed"] == len(MALFORMED)
        stats = json.loads(dinrec(env, "ingest", "--idle-exit", "3").stdout.splitlines()[-1])
        assert (stats["applied"], stats["dead_lettered"]) == (0, len(MALFORMED))
        assert json.loads(dinrec(env, "ingest", "dlq", "--replay").stdout)["replayed"] == len(MALFORMED)
        assert json.loads(dinrec(env, "ingest", "dlq", "--replay").stdout)["replayed"] == 0
    finally:
        stream.close()
        store.flush_prefix()
        store.close()


@pytest.mark.kafka
@pytest.mark.redis
def test_backfill_warms_the_store_directly_or_through_kafka_and_never_twice(redis_url, kafka_bootstrap, unique,
                                                                          tmp_path):
    from dinrec.datasets import load_dataset
    from tests.conftest import synthetic_dataset_dir

    data = synthetic_dataset_dir(tmp_path / "data", n_users=60, n_items=80, n_categories=5, seed=4)
    behaviours = len(load_dataset(data).behaviours())
    env = {**os.environ, "DINREC_STORE": "redis", "DINREC_STREAM": "kafka", "DINREC_REDIS_URL": redis_url,
           "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique, "DINREC_REDIS_PREFIX": unique,
           "DINREC_CONSUMER_GROUP": f"{unique}-ingest"}
    direct = RedisStore(redis_url, prefix=f"{unique}-direct")
    via_kafka = RedisStore(redis_url, prefix=unique)
    try:
        out = json.loads(dinrec({**env, "DINREC_REDIS_PREFIX": f"{unique}-direct"}, "ingest", "backfill",
                                "--data", str(data), "--to", "store", "--chunk", "700").stdout.splitlines()[-1])
        assert out["applied"] == behaviours and direct.applied_behaviours() == behaviours
        again = json.loads(dinrec({**env, "DINREC_REDIS_PREFIX": f"{unique}-direct"}, "ingest", "backfill",
                                  "--data", str(data), "--to", "store").stdout.splitlines()[-1])
        assert again["applied"] == 0

        sent = json.loads(dinrec(env, "ingest", "backfill", "--data", str(data)).stdout.splitlines()[-1])
        assert sent["to"] == "stream" and sent["events"] == len(load_dataset(data))
        dinrec(env, "ingest", "--idle-exit", "3")
        assert via_kafka.popular(10**6) == direct.popular(10**6)
        user = load_dataset(data).user_id[0]
        assert via_kafka.history(user, 50) == direct.history(user, 50)
    finally:
        for s in (direct, via_kafka):
            s.flush_prefix()
            s.close()


def test_metrics_and_status_endpoints_report_what_the_ingestor_did():
    stream, store = InProcessStream(), MemoryStore()
    stream.publish(good_events(30))
    stream.publish_raw([OutgoingRecord(b"{oops")])
    ingestor = Ingestor(stream, store, "g")
    server = serve_stats(ingestor.stats, 0)
    try:
        ingestor.run(max_records=31)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        metrics = httpx.get(base + "/metrics").text
        assert "dinrec_ingest_applied_total 30.0" in metrics
        assert "dinrec_ingest_dead_lettered_total 1.0" in metrics
        assert 'dinrec_ingest_lag_records{partition="0"} 0.0' in metrics
        assert "dinrec_ingest_apply_seconds_count 1.0" in metrics
        assert "process_resident_memory_bytes " in metrics and "process_open_fds " in metrics
        status = httpx.get(base + "/status").json()
        assert (status["consumed"], status["applied"], status["dead_lettered"]) == (31, 30, 1)
        assert status["apply_p50_ms"] > 0
        assert httpx.get(base + "/nope").status_code == 404
    finally:
        server.shutdown()
        server.server_close()
        ingestor.close()
    one = Ingestor(stream, MemoryStore(), "another")  # stops after the record at offset 0
    assert one.run(max_records=1).lag == {0: 30}
    one.close()


@pytest.mark.kafka
@pytest.mark.redis
def test_ingest_creates_its_dead_letter_topic_before_any_record_needs_it(redis_url, kafka_bootstrap, unique):
    from confluent_kafka.admin import AdminClient

    stream = KafkaStream(kafka_bootstrap, unique)
    stream.publish_raw([OutgoingRecord(e.to_bytes(), key=e.user_id.encode()) for e in good_events(3)])
    env = {**os.environ, "DINREC_STORE": "redis", "DINREC_STREAM": "kafka", "DINREC_REDIS_URL": redis_url,
           "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique, "DINREC_REDIS_PREFIX": unique,
           "DINREC_CONSUMER_GROUP": f"{unique}-ingest"}
    store = RedisStore(redis_url, prefix=unique)
    try:
        dinrec(env, "ingest", "--max-records", "3")
        topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
        assert f"{unique}.dlq" in topics  # no record was dead-lettered: it was made up front
    finally:
        stream.close()
        store.flush_prefix()
        store.close()
