"""The HTTP API, through a real server, on the embedded store and on Redis."""

from __future__ import annotations

import pytest

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import online_store, wait_until
from tests.serving.conftest import live_server


@pytest.fixture(params=["memory", "redis"])
def store(request, unique):
    yield from online_store(request.param, request, unique, history_cap=50)


@pytest.fixture
def client(tiny_run, store):
    data = tiny_run[0]
    store.write(list(data.events()))
    settings = ServingSettings(bundle_dir=tiny_run[2], max_k=50, events_sink="store")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        yield c


def test_known_user_gets_din_ranked_unseen_items(client, tiny_run, store):
    data = tiny_run[0]
    user = data.user_id[0]
    r = client.get("/recommend", params={"user_id": user, "k": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["strategy"] == "din" and body["user_id"] == user and len(body["items"]) == 7
    assert body["model_version"] == tiny_run[3].get("model_version", body["model_version"])
    scores = [x["score"] for x in body["items"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    seen = {h.item_id for h in store.history(user, 50)}
    assert not seen & {x["item_id"] for x in body["items"]}
    assert r.headers["x-request-id"] == body["request_id"]


def test_post_recommend_matches_get(client, tiny_run):
    user = tiny_run[0].user_id[5]
    a = client.get("/recommend", params={"user_id": user, "k": 5}).json()
    b = client.post("/recommend", json={"user_id": user, "k": 5}).json()
    assert a["items"] == b["items"]


def test_unknown_user_gets_popular_items_not_an_error(client):
    body = client.get("/recommend", params={"user_id": "nobody-ever", "k": 4}).json()
    assert body["strategy"] == "popular" and len(body["items"]) == 4 and body["items"][0]["score"] == 1.0


def test_events_change_the_recommendations(client):
    before = client.get("/recommend", params={"user_id": "fresh", "k": 5}).json()
    r = client.post("/events", json={"events": [
        {"event_id": "f1", "user_id": "fresh", "item_id": "i3", "category_id": "c1", "ts": 1.7e9},
        {"event_id": "f2", "user_id": "fresh", "item_id": "i4", "category_id": "c1", "ts": 1.7e9 + 1}]})
    assert r.status_code == 202 and r.json() == {"accepted": 2, "sink": "store"}
    after = client.get("/recommend", params={"user_id": "fresh", "k": 5}).json()
    assert before["strategy"] == "popular" and after["strategy"] == "din" and after["history_len"] == 2
    assert {"i3", "i4"}.isdisjoint({x["item_id"] for x in after["items"]})


@pytest.mark.parametrize("params, field", [
    ({"user_id": "u1", "k": 0}, "k"), ({"user_id": "u1", "k": 51}, "k"), ({"user_id": "u1", "k": "ten"}, "k"),
    ({"k": 3}, "user_id"), ({"user_id": "", "k": 3}, "user_id"), ({"user_id": "x" * 200}, "user_id"),
])
def test_bad_recommend_queries_are_4xx_json_naming_the_field(client, params, field):
    r = client.get("/recommend", params=params)
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_request" and field in body["message"]


@pytest.mark.parametrize("payload, needle", [
    ({"events": []}, "events"),
    ({"events": [{"user_id": "u", "item_id": "i"}]}, "ts"),
    ({"events": [{"user_id": "u", "item_id": "i", "ts": 1, "event_type": "like"}]}, "event_type"),
    ({"events": [{"user_id": "u", "item_id": "i", "ts": "yesterday"}]}, "ts"),
    ({"user_id": "u"}, "events"),
])
def test_bad_events_are_rejected_and_nothing_is_written(client, store, payload, needle):
    r = client.post("/events", json=payload)
    assert r.status_code == 422 and needle in r.json()["message"]
    assert store.history("u", 10) == []


def test_malformed_json_body_is_a_4xx(client):
    r = client.post("/events", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"


def test_a_dead_store_means_degraded_answers_not_errors(tiny_run):
    dead = RedisStore("redis://127.0.0.1:1/0", socket_timeout_s=0.2)
    with live_server(ServingSettings(bundle_dir=tiny_run[2]), FeatureStoreSettings(), store=dead,
                     stream=InProcessStream(), operator=True) as c:
        r = c.get("/recommend", params={"user_id": "u1", "k": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["degraded"] and body["degraded_reasons"] == ["feature_store"]
        assert body["strategy"] == "popular" and len(body["items"]) == 5
        # The client's own context still gets a personal ranking.
        known = tiny_run[0].item_id[:3].tolist()
        r = c.post("/recommend", json={"user_id": "u1", "k": 5, "context": [{"item_id": i} for i in known]})
        body = r.json()
        assert r.status_code == 200 and body["degraded"] and body["strategy"] == "din" and body["history_len"] == 3
        assert not set(known) & {x["item_id"] for x in body["items"]}
        ready = c.get("/readyz")  # the operator is told, and the replica stays in the load balancer
        assert ready.status_code == 200 and ready.json()["store"] == "unavailable"
        assert "dinrec_store_up 0.0" in c.get("/metrics").text
        assert 'dinrec_degraded_responses_total{reason="feature_store"} 2.0' in c.get("/metrics").text


def test_a_ranking_failure_answers_with_popular_items(tiny_run, store):
    store.write(list(tiny_run[0].events()))
    with live_server(ServingSettings(bundle_dir=tiny_run[2]), FeatureStoreSettings(), store=store,
                     stream=InProcessStream(), operator=True) as c:
        user = tiny_run[0].user_id[0]
        assert c.get("/recommend", params={"user_id": user}).json()["strategy"] == "din"

        class Broken:
            def score(self, *args, **kwargs):
                raise RuntimeError("the model failed")

        c.service_state().recommender.scorer = Broken()  # a fault injected into our own object
        body = c.get("/recommend", params={"user_id": user, "k": 4}).json()
        assert body["degraded"] and body["degraded_reasons"] == ["ranking"] and body["strategy"] == "popular"
        assert len(body["items"]) == 4


def test_every_error_has_one_shape(client):
    for r in (client.get("/nowhere"), client.delete("/recommend"),
              client.get("/recommend", params={"user_id": "u", "k": 51}),
              client.post("/events", content=b"[", headers={"content-type": "application/json"})):
        body = r.json()
        assert r.status_code in (404, 405, 422) and set(body) >= {"error", "message", "request_id"}, body
        assert body["request_id"] == r.headers["x-request-id"]


def test_events_through_the_in_process_stream_reach_the_store(tiny_run):
    store, stream = MemoryStore(), InProcessStream()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream"), FeatureStoreSettings(),
                     store=store, stream=stream, operator=True) as c:
        event = {"event_id": "s1", "user_id": "s", "item_id": "i1", "ts": 5}
        assert c.post("/events", json={"events": [event]}).status_code == 202
        wait_until(lambda: store.history("s", 5))
        assert c.get("/recommend", params={"user_id": "s"}).json()["history_len"] == 1


def test_a_tampered_bundle_stops_start_up(tiny_run, tmp_path):
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO, free_port

    copy = tmp_path / "b"
    shutil.copytree(tiny_run[2], copy)
    (copy / "popularity.json").write_text("[]")
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "serve", "--bundle", str(copy),
                          "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "checksum mismatch for popularity.json" in out.stderr


def test_events_are_refused_with_retry_after_when_the_outbox_is_full(tiny_run, tmp_path):
    from dinrec.streams.kafka_stream import KafkaStream

    down = KafkaStream("127.0.0.1:1", "t", request_timeout_ms=500)  # nothing is ever acknowledged
    fs = FeatureStoreSettings(outbox_dir=tmp_path, outbox_max_bytes=1 << 16)
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream", shutdown_drain_s=0), fs,
                     store=MemoryStore(), stream=down) as c:
        batch = {"events": [{"user_id": f"u{i}", "item_id": "i1", "ts": 5, "event_id": f"e{i}"} for i in range(100)]}
        codes = [c.post("/events", json=batch).status_code for _ in range(40)]
        assert codes[0] == 202 and codes[-1] == 503
        r = c.post("/events", json=batch)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"] == "events_backlog_full"
    down.close()


def test_a_stopped_service_leaves_its_port_closed(tiny_run):
    """The in-flight cap reads the accept queue through a duplicate of the listening socket; shutting down
    closes it too, or the port would stay listening, accepting connections nobody serves."""
    import socket

    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", max_in_flight=8)
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        port = int(str(c.base_url).rsplit(":", 1)[1].rstrip("/"))
        assert c.get("/recommend", params={"user_id": "u1"}).status_code == 200  # the cap found the socket
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
