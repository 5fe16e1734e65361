"""A fleet that agrees: three `dinrec serve` replicas (processes, two workers each) on loopback sharing the
Redis Cluster, Kafka, the registry and the experiments document, with one `dinrec ingest` between the
stream and the store. An A/A experiment driven across all of them counts exactly what its clients saw
and clicked; an experiment change through one replica's admin API is served by every worker of every
replica within the poll; a fleet reload and rollback through two others move every replica; each
replica's /metrics, whichever worker answers, totals the requests that replica was sent."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from dinrec.experiments import open_state
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.serving.server import free_port
from dinrec.streams.kafka_stream import KafkaStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, REPO, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 4
AA = {"name": "aa", "status": "running", "seed": "fleet", "variants": [{"name": "a"}, {"name": "b"}]}


@contextlib.contextmanager
def fleet(tmp_path, env: dict[str, str], replicas: int = 3):
    """``replicas`` `dinrec serve --workers 2` processes and one `dinrec ingest`; yields their base URLs."""
    procs, logs, urls = [], [], []
    try:
        log = (tmp_path / "ingest.log").open("w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "ingest"], cwd=REPO, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
        for n in range(replicas):
            port = free_port()
            log = (tmp_path / f"serve-{n}.log").open("w")
            logs.append(log)
            replica_env = {**env, "DINREC_OUTBOX_DIR": str(tmp_path / f"outbox-{n}")}
            procs.append(subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "serve", "--port", str(port),
                                           "--workers", "2"], cwd=REPO, env=replica_env, stdout=log,
                                          stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")

        def ready(url: str) -> bool:
            try:
                return httpx.get(url + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        for n, url in enumerate(urls):
            wait_until(lambda u=url: ready(u) or any(p.poll() is not None for p in procs), timeout_s=300,
                       interval_s=0.5, what=f"replica {n} to start")
            assert all(p.poll() is None for p in procs), (tmp_path / f"serve-{n}.log").read_text()[-3000:]
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def every_worker(url: str, path: str, times: int = 8) -> list[dict]:
    """``path`` asked on fresh connections (the kernel hands them to either worker)."""
    return [httpx.get(url + path, headers=ADMIN_HEADERS, timeout=10).json() for _ in range(times)]


def test_three_replicas_agree_on_counts_experiments_models_and_metrics(registry, redis_cluster_url, kafka_bootstrap,
                                                                        unique, tmp_path):
    experiments = tmp_path / "experiments.json"
    experiments.write_text(json.dumps({"version": 1, "experiments": [AA]}))
    stream = KafkaStream(kafka_bootstrap, unique)
    assert stream.ensure_topic(PARTITIONS) == PARTITIONS
    store = RedisStore(redis_cluster_url, prefix=unique, partitions=PARTITIONS, cluster=True)
    env = {**os.environ, "DINREC_STORE": "redis-cluster", "DINREC_REDIS_URL": redis_cluster_url,
           "DINREC_STORE_PARTITIONS": str(PARTITIONS), "DINREC_REDIS_PREFIX": unique, "DINREC_STREAM": "kafka",
           "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique, "DINREC_CONSUMER_GROUP": unique,
           "DINREC_TOPIC_PARTITIONS": str(PARTITIONS), "DINREC_REGISTRY": str(registry.root),
           "DINREC_EXPERIMENTS_FILE": str(experiments), "DINREC_ADMIN_TOKEN": ADMIN_TOKEN,
           "DINREC_RELOAD_POLL_S": "0.2", "DINREC_GUARDRAIL_INTERVAL_S": "3600", "DINREC_INGEST_IN_APP": "false",
           "DINREC_SCORE_PRECISION": "fp32", "DINREC_LOG_FORMAT": "text"}
    sent = {}  # replica -> /recommend requests answered 200
    try:
        with fleet(tmp_path, env) as urls:
            sent = dict.fromkeys(urls, 0)

            def recommend(url: str, user: str) -> dict:
                r = httpx.get(url + "/recommend", params={"user_id": user, "k": 4}, headers=ADMIN_HEADERS,
                              timeout=30)  # the operator's answers name the arm
                assert r.status_code == 200, r.text
                sent[url] += 1
                return r.json()

            # A/A across the fleet: user i asks replica i % 3; a third click their first item through another.
            users = [f"fleet-{i}" for i in range(36)]
            answers = {u: recommend(urls[i % 3], u) for i, u in enumerate(users)}
            want = {"a": [0, 0, 0], "b": [0, 0, 0]}  # users, impressions, clicks
            for a in answers.values():
                want[a["variant"]][0] += 1
                want[a["variant"]][1] += len(a["items"])
            state = open_state(store)

            def counted() -> dict:
                return {v: [s.users, int(s.impressions), int(s.clicks)] for v, s in state.sums("aa").items()}

            shown = {v: [w[0], w[1], 0] for v, w in want.items()}
            wait_until(lambda: counted() == shown, timeout_s=120, interval_s=0.5,
                       what=f"every impression, from every replica's outbox, to be counted: {shown}")
            for i, (u, a) in enumerate(answers.items()):
                if i % 3 == 0:  # people click after they are shown the list
                    want[a["variant"]][2] += 1
                    click = {"event_id": f"c-{u}", "user_id": u, "item_id": a["items"][0]["item_id"],
                             "event_type": "click", "ts": time.time(), "request_id": a["request_id"]}
                    assert httpx.post(urls[(i + 1) % 3] + "/events", json={"events": [click]},
                                      timeout=30).status_code == 202
            wait_until(lambda: counted() == want, timeout_s=120, interval_s=0.5,
                       what=f"the A/A counts to be what the clients saw and clicked: {want}")
            assert state.unattributed() == {"orphan_clicks": 0, "variant_conflicts": 0, "capped": 0}

            # An experiment change through replica 0: every worker of every replica serves it within the poll.
            late = {**AA, "name": "late", "seed": "late"}
            r = httpx.put(urls[0] + "/admin/experiments/late", json=late, headers=ADMIN_HEADERS, timeout=30)
            assert r.status_code == 200 and r.json()["version"] == 2, r.text
            for url in urls:
                wait_until(lambda u=url: all({e["name"] for e in x["experiments"]} == {"aa", "late"}
                                             for x in every_worker(u, "/experiments")),
                           timeout_s=30, what=f"{url}'s workers to serve the new experiments document")

            # A fleet reload through replica 1 and a rollback through replica 2 move every worker of every replica.
            assert httpx.post(urls[1] + "/admin/reload", json={"version": "v2"}, headers=ADMIN_HEADERS,
                              timeout=120).json()["scope"] == "fleet"
            for url in urls:
                wait_until(lambda u=url: {m["version"] for m in every_worker(u, "/admin/model")} == {"v2"},
                           timeout_s=60, what=f"{url} to serve v2")
            back = httpx.post(urls[2] + "/admin/rollback", headers=ADMIN_HEADERS, timeout=120)
            assert back.status_code == 200 and back.json()["version"] == "v1"
            for url in urls:
                wait_until(lambda u=url: {m["version"] for m in every_worker(u, "/admin/model")} == {"v1"},
                           timeout_s=60, what=f"{url} to roll back to v1")
            assert registry.resolve("champion") == "v1"

            # Metrics: any worker's scrape answers for its replica, and counts each request once.
            for url in urls:
                for _ in range(4):
                    text = httpx.get(url + "/metrics", timeout=10).text
                    served = re.findall(r'dinrec_http_request_seconds_count\{route="/recommend",status="200"\} (\S+)',
                                        text)
                    assert served == [f"{sent[url]:.1f}"], (url, served, sent[url])
    finally:
        stream.close()
        store.flush_prefix()
        store.close()
