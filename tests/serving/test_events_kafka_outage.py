"""Kafka stopped while POST /events is under load: no request waits past its deadline, and every
accepted event is in the topic once Kafka is back. A broker of the test's own (started with
deploy/local/services.sh on other ports), since this one is stopped and started again."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import httpx
import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.app import create_app
from dinrec.serving.server import free_port, serve_in_thread
from dinrec.serving.settings import ServingSettings
from dinrec.streams.kafka_stream import KafkaStream
from tests.conftest import REPO, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DEADLINE_S = 2.0
SERVICES = REPO / "deploy" / "local" / "services.sh"


class Broker:
    def __init__(self, run_dir) -> None:
        self.port, self.controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "DINREC_KAFKA_BOOTSTRAP"}
        self.env = {**env, "DINREC_SERVICES_RUN": str(run_dir), "DINREC_LOCAL_KAFKA_PORT": str(self.port),
                    "DINREC_LOCAL_KAFKA_CONTROLLER_PORT": str(self.controller)}

    def _run(self, command: str) -> None:
        out = subprocess.run(["bash", str(SERVICES), command], env=self.env, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]

    def start(self) -> None:
        self._run("kafka-start")

    def stop(self) -> None:
        self._run("kafka-stop")
        wait_until(lambda: not _listening(self.port), timeout_s=60, what="the broker's port to close")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def broker(tmp_path, kafka_bootstrap):  # kafka_bootstrap: only runs where the test services run
    b = Broker(tmp_path / "kafka")
    b.start()
    yield b
    b.stop()


def test_a_kafka_outage_delays_no_request_and_loses_no_accepted_event(broker, tiny_run, unique, tmp_path):
    stream = KafkaStream(broker.bootstrap, unique, request_timeout_ms=2000)
    stream.ensure_topic(4)
    fs = FeatureStoreSettings(stream="kafka", kafka_bootstrap=broker.bootstrap, topic=unique,
                              outbox_dir=tmp_path / "outbox")
    # No per-user quota: the load is a few users posting as fast as they can (the journal is what is tried).
    app = create_app(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream", ingest_in_app=False,
                                     shutdown_drain_s=60, events_per_user_per_minute=0), fs, store=MemoryStore(),
                     stream=stream)
    port = free_port()
    accepted: set[str] = set()
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(n: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE_S) as c:
            i = 0
            while not stop.is_set():
                ids = [f"c{n}-{i}-{j}" for j in range(20)]
                i += 1
                body = {"events": [{"event_id": e, "user_id": f"u{n}-{j}", "item_id": f"i{j}", "ts": 1.7e9}
                                   for j, e in enumerate(ids)]}
                t0 = time.monotonic()
                try:
                    r = c.post("/events", json=body)
                except httpx.HTTPError as exc:  # a timeout is a request that waited past its deadline
                    failures.append(repr(exc))
                    continue
                with lock:
                    latencies.append(time.monotonic() - t0)
                    if r.status_code == 202:
                        accepted.update(ids)
                    else:
                        failures.append(f"{r.status_code} {r.text[:200]}")
                time.sleep(0.01)

    with serve_in_thread(app, port):
        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(2)
        before_outage = len(accepted)
        broker.stop()
        time.sleep(4)  # requests keep coming while Kafka is down
        during_outage = len(accepted) - before_outage
        broker.start()
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        # Kafka is back: the journal drains to it (the lifespan's shutdown also waits for that).
        got: set[str] = set()
        consumer = stream.consumer(f"{unique}-check")

        def all_arrived() -> bool:
            got.update(BehaviourEvent.from_bytes(r.value).event_id for r in consumer.poll(5000, 0.5))
            return accepted <= got

        wait_until(all_arrived, timeout_s=120, interval_s=0.1, what="every accepted event in the topic")
        consumer.close()
    stream.close()
    assert not failures, failures[:5]
    assert before_outage > 0 and during_outage > 0, "the outage did not happen under load"
    assert max(latencies) < DEADLINE_S
    assert accepted <= got
