"""The production wiring, all real: POST /events → Kafka → `dinrec ingest` → Redis → /recommend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.kafka_stream import KafkaStream
from tests.conftest import REPO, wait_until
from tests.serving.conftest import live_server


@pytest.fixture
def ingest_process(redis_url, kafka_bootstrap, unique):
    env = {**os.environ, "DINREC_STORE": "redis", "DINREC_STREAM": "kafka", "DINREC_REDIS_URL": redis_url,
           "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique, "DINREC_REDIS_PREFIX": unique,
           "DINREC_CONSUMER_GROUP": f"{unique}-ingest"}
    proc = subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "ingest"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["consumed"] >= 1


def test_an_event_produced_to_kafka_reaches_redis_and_changes_recommend(tiny_run, redis_url, kafka_bootstrap,
                                                                      unique, ingest_process, tmp_path):
    fs = FeatureStoreSettings(store="redis", stream="kafka", redis_url=redis_url, kafka_bootstrap=kafka_bootstrap,
                              topic=unique, redis_prefix=unique, outbox_dir=tmp_path / "outbox")
    store = RedisStore(redis_url, prefix=unique)
    stream = KafkaStream(kafka_bootstrap, unique)
    try:
        settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="stream", ingest_in_app=False)
        with live_server(settings, fs, store=store, stream=stream, operator=True) as client:
            before = client.get("/recommend", params={"user_id": "kafka-user", "k": 5}).json()
            assert before["strategy"] == "popular" and before["history_len"] == 0
            r = client.post("/events", json={"events": [
                {"event_id": "k1", "user_id": "kafka-user", "item_id": "i7", "category_id": "c3", "ts": 1.7e9}]})
            assert r.status_code == 202 and r.json()["sink"] == "stream"
            hist = wait_until(lambda: store.history("kafka-user", 10), timeout_s=60)
            assert [h.item_id for h in hist] == ["i7"]
            after = client.get("/recommend", params={"user_id": "kafka-user", "k": 5}).json()
            assert after["strategy"] == "din" and after["history_len"] == 1 and after["items"] != before["items"]
    finally:
        stream.close()
        store.flush_prefix()
        store.close()


def test_ingest_refuses_the_in_process_stream():
    env = {**os.environ, "DINREC_STREAM": "inprocess"}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "ingest"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DINREC_STREAM=kafka" in out.stderr
