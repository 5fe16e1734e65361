"""Clients the service must not trust: what one request sends cannot stop impression logging, forge
A/B counts through the public /events, or slip a body past the size limit; a background thread that
meets an error is restarted and counted, and readiness says when one is down (the store is no reason)."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.experiments import open_state
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.impressions import ImpressionLog, ServedList
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, wait_until
from tests.serving.conftest import live_server


def logged_impressions(consumer) -> set[str]:
    return {BehaviourEvent.from_bytes(r.value).event_id for r in consumer.poll(max_records=10_000, timeout_s=0.2)}


def test_a_control_character_or_a_tab_cannot_stop_impression_logging(tiny_run, tmp_path):
    stream = InProcessStream()
    check = stream.consumer("check")
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream", ingest_in_app=False),
                     FeatureStoreSettings(outbox_dir=tmp_path), store=MemoryStore(), stream=stream) as c:
        r = c.get("/recommend", params={"user_id": "a\x01b", "k": 3})
        assert r.status_code == 422 and "control characters" in r.json()["message"]
        tab = c.get("/recommend", params={"user_id": "u1", "k": 3}, headers={"x-request-id": "bad\tid"})
        assert tab.status_code == 200
        rid = tab.json()["request_id"]
        assert rid != "bad\tid" and re.fullmatch(r"[0-9a-f]{32}", rid) and tab.headers["x-request-id"] == rid
        kept = c.get("/recommend", params={"user_id": "u1", "k": 3}, headers={"x-request-id": "gw-7:a.b_c"})
        assert kept.json()["request_id"] == "gw-7:a.b_c"  # a plain token from a gateway is kept
        after = c.get("/recommend", params={"user_id": "u2", "k": 3}).json()["request_id"]
        want = {f"imp-{req}-{p}" for req in (rid, "gw-7:a.b_c", after) for p in range(3)}
        got: set[str] = set()

        def all_logged() -> bool:
            got.update(logged_impressions(check))
            return want <= got

        wait_until(all_logged, what="every later list logged as impressions")
        state = c.service_state()
        assert state.impressions.alive and c.get("/readyz").status_code == 200


def test_a_list_the_event_schema_refuses_is_dropped_and_counted_and_logging_goes_on():
    written: list[BehaviourEvent] = []
    dropped: list[int] = []
    log = ImpressionLog(written.extend, on_drop=dropped.append, batch=1)
    log.log(ServedList("r1", "bad\x00user", [("i1", "c1"), ("i2", "c1")], None, None, "m1", 1.0))
    log.log(ServedList("r2", "u2", [("i3", "c1")], None, None, "m1", 1.0))
    log.close()
    assert [e.event_id for e in written] == ["imp-r2-0"] and dropped == [2]


@pytest.mark.parametrize("field, value, named", [
    ("event_type", "impression", "event_type"),
    ("experiment", "retrain-v7", "experiment"),
    ("variant", "treatment", "variant"),
    ("position", 0, "position"),
    ("model_version", "m1", "model_version"),
    ("event_id", None, "event_id"),
    ("ts", "future", "ts"),
])
def test_public_events_cannot_carry_what_only_the_service_sets(tiny_run, field, value, named):
    store = MemoryStore()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=store, stream=InProcessStream()) as c:
        event = {"event_id": "e1", "user_id": "victim", "item_id": "i1", "ts": time.time(), "request_id": "r1"}
        if value is None:
            del event[field]
        else:
            event[field] = time.time() + 3600 if value == "future" else value
        good = {"event_id": "e0", "user_id": "victim", "item_id": "i0", "ts": time.time() - 10}
        r = c.post("/events", json={"events": [good, event]})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error"] == "invalid_request" and [p["field"] for p in body["problems"]] == [f"events.1.{named}"]
        assert store.history("victim", 10) == []  # the whole batch is refused: nothing half-applied
        assert open_state(store).sums("retrain-v7") == {}


def test_a_click_a_client_may_send_is_accepted(tiny_run):
    store = MemoryStore()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=store, stream=InProcessStream()) as c:
        click = {"event_id": "e1", "user_id": "u", "item_id": "i1", "event_type": "click", "ts": time.time(),
                 "request_id": "0123456789abcdef0123456789abcdef"}
        assert c.post("/events", json={"events": [click]}).status_code == 202
        assert [h.item_id for h in store.history("u", 10)] == ["i1"]


def test_a_chunked_body_over_the_limit_is_refused_and_one_under_it_arrives(tiny_run):
    store = MemoryStore()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store", max_body_bytes=2048),
                     FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        def chunks(payload: bytes, size: int = 512):
            for i in range(0, len(payload), size):
                yield payload[i:i + size]

        big = b'{"events": [' + b",".join(
            b'{"event_id": "e%d", "user_id": "u", "item_id": "i%d", "ts": 5}' % (i, i) for i in range(200)) + b"]}"
        r = c.post("/events", content=chunks(big), headers={"content-type": "application/json"})
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert r.status_code == 413 and r.json()["error"] == "request_too_large"
        assert store.history("u", 10) == []
        small = b'{"events": [{"event_id": "e1", "user_id": "u", "item_id": "i1", "ts": 5}]}'
        r = c.post("/events", content=chunks(small, 16), headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        assert [h.item_id for h in store.history("u", 10)] == ["i1"]


class FailsOnce(MemoryStore):
    """A store whose first write raises an error nobody foresaw (not StoreUnavailable)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def write(self, events, offsets=None):
        if not self.failed:
            self.failed = True
            raise RuntimeError("a bug in the store client")
        return super().write(events, offsets)


def test_an_ingest_thread_that_meets_an_unforeseen_error_is_restarted_and_loses_nothing(tiny_run, tmp_path):
    store = FailsOnce()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream", ingest_in_app=True),
                     FeatureStoreSettings(outbox_dir=tmp_path), store=store, stream=InProcessStream()) as c:
        event = {"event_id": "e1", "user_id": "u", "item_id": "i1", "ts": 5}
        assert c.post("/events", json={"events": [event]}).status_code == 202
        wait_until(lambda: store.history("u", 10), what="the event applied after the restart")
        metrics = c.get("/metrics").text
        assert store.failed and 'dinrec_thread_restarts_total{name="dinrec-ingest"} 1.0' in metrics
        assert 'dinrec_thread_alive{name="dinrec-ingest"} 1.0' in metrics
        assert 'dinrec_thread_alive{name="dinrec-impressions"} 1.0' in metrics
        assert 'dinrec_thread_alive{name="dinrec-outbox"} 1.0' in metrics


def test_readiness_is_lost_when_impression_logging_stops_and_kept_when_the_store_is_down(tiny_run):
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=MemoryStore(), stream=InProcessStream()) as c:
        assert c.get("/readyz").json() == {"status": "ready", "store": "ok",
                                           "model_version": c.service_state().recommender.model_version}
        c.service_state().impressions.close()  # as if the logger had ended
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "not_ready" and r.json()["threads_down"] == ["dinrec-impressions"]
        assert 'dinrec_thread_alive{name="dinrec-impressions"} 0.0' in c.get("/metrics").text


@pytest.mark.parametrize("token, error", [
    ("change-me", "too short"), ("s3cret", "too short"), ("change-me-" + "0" * 30, "placeholder"),
    ("a" * 40, "placeholder"), ("0f3c9a7e5b1d4f6a 8c2e9b7d5a3f1c8e", "printable ASCII"),
])
def test_a_weak_or_placeholder_admin_token_is_refused_at_start_up(token, error):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=error):
        ServingSettings(admin_token=token)
    assert ServingSettings(admin_token="").admin_token is None  # empty: admin off, as unset


def raw_status(port: int, path: str, header: bytes | None) -> int:
    """GET ``path`` with the Authorization line exactly as given (httpx refuses a trailing space, which
    is just what an attacker sends: `Authorization: Bearer ` against an empty token)."""

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        line = b"" if header is None else b"Authorization: " + header + b"\r\n"
        sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + line + b"Connection: close\r\n\r\n")
        return int(sock.recv(64).split()[1])


@pytest.mark.parametrize("header, status", [
    (None, 401), (b"Bearer ", 401), (b"Bearer", 401), (b"Basic " + ADMIN_TOKEN.encode(), 401),
    (b"Bearer wrong", 401), (f"Bearer {ADMIN_TOKEN}x".encode(), 401), (f"bearer {ADMIN_TOKEN}".encode(), 200),
    (f"Bearer  {ADMIN_TOKEN} ".encode(), 200),
])
def test_the_admin_credential_is_read_apart_from_its_scheme(tiny_run, header, status):
    with live_server(ServingSettings(bundle_dir=tiny_run[2], admin_token=ADMIN_TOKEN), FeatureStoreSettings(),
                     store=MemoryStore(), stream=InProcessStream()) as c:
        assert raw_status(c.base_url.port, "/admin/model", header) == status


def test_every_admin_change_leaves_an_audit_line(tiny_run, caplog):
    with live_server(ServingSettings(bundle_dir=tiny_run[2], admin_token=ADMIN_TOKEN), FeatureStoreSettings(),
                     store=MemoryStore(), stream=InProcessStream()) as c:
        with caplog.at_level("WARNING", logger="dinrec.audit"):
            r = c.post("/admin/instance/reload", headers=ADMIN_HEADERS)
        assert r.status_code == 200 and r.json()["scope"] == "instance", r.text
        (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "dinrec.audit"]
        assert line.startswith("admin instance reload /admin/instance/reload from 127.0.0.1:") and "now=" in line
        # Without a registry there is no alias for a fleet to follow: the fleet-wide routes say so.
        fleet = c.post("/admin/rollback", headers=ADMIN_HEADERS)
        assert fleet.status_code == 409 and "/admin/instance/rollback" in fleet.json()["message"]


class Stalls(MemoryStore):
    """A store whose first read blocks (the worker's loop with it, as a slow read does) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.reading, self.release = threading.Event(), threading.Event()

    def history_and_interacted(self, user_id, limit):
        if not self.reading.is_set():
            self.reading.set()
            self.release.wait(30)
        return super().history_and_interacted(user_id, limit)


def test_overload_sheds_the_newest_requests_at_once_and_probes_still_answer(tiny_run):
    """Twenty-four keep-alive clients (a load balancer's connections) send while the worker is stuck: they
    are read together, three are held (the cap) and the rest of that batch is refused at once, not queued."""
    from http.client import HTTPConnection

    store = Stalls()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store", max_in_flight=3),
                     FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        port = c.base_url.port
        clients = [HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(25)]
        for conn in clients:  # open and warm each connection
            conn.request("GET", "/healthz")
            assert conn.getresponse().read() == b'{"status":"ok"}'
        first, *others = clients
        first.request("GET", "/recommend?user_id=u0&k=3")
        assert store.reading.wait(30)  # the worker is stuck inside the first request
        for i, conn in enumerate(others, 1):
            conn.request("GET", f"/recommend?user_id=u{i}&k=3")
        probe = HTTPConnection("127.0.0.1", port, timeout=30)
        probe.request("GET", "/healthz")
        store.release.set()
        answers = [conn.getresponse() for conn in clients]
        bodies = [a.read() for a in answers]
        assert probe.getresponse().status == 200
        codes = [a.status for a in answers]
        # The first three read after the stall are held; beyond the cap, requests are refused at once.
        assert codes[:4] == [200] * 4 and set(codes) == {200, 503}, codes
        shed = [(a, body) for a, body in zip(answers, bodies, strict=True) if a.status == 503]
        assert all(a.getheader("retry-after") == "1" and b'"error":"overloaded"' in body for a, body in shed)
        assert f"dinrec_shed_requests_total {float(len(shed))}" in c.get("/metrics").text
        for conn in [*clients, probe]:
            conn.close()


def test_behind_a_gateway_a_request_answers_and_writes_only_for_its_own_user(tiny_run):
    store = MemoryStore()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store", user_header="x-user-id"),
                     FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        me = {"x-user-id": "alice"}
        assert c.get("/recommend", params={"user_id": "alice", "k": 3}, headers=me).status_code == 200
        assert c.get("/recommend", params={"user_id": "alice", "k": 3}).status_code == 401
        r = c.get("/recommend", params={"user_id": "bob", "k": 3}, headers=me)
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        assert c.post("/recommend", json={"user_id": "bob", "k": 3}, headers=me).status_code == 403
        own = {"event_id": "e1", "user_id": "alice", "item_id": "i1", "ts": 5}
        forged = {"event_id": "e2", "user_id": "bob", "item_id": "spam", "ts": 5}
        assert c.post("/events", json={"events": [own, forged]}, headers=me).status_code == 403
        assert store.history("bob", 5) == [] and store.history("alice", 5) == []
        assert c.post("/events", json={"events": [own]}, headers=me).status_code == 202
        assert [h.item_id for h in store.history("alice", 5)] == ["i1"]
        # A gateway that appends its header after the client's: two values, and the request is refused
        # (not answered for the first one, the client's).
        twice = [("x-user-id", "bob"), ("x-user-id", "alice")]
        r = c.get("/recommend", params={"user_id": "bob", "k": 3}, headers=twice)
        assert r.status_code == 400 and "2 times" in r.json()["message"]
        assert c.post("/events", json={"events": [forged]}, headers=twice).status_code == 400
        assert store.history("bob", 5) == []


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "api.example.com"])
def test_beyond_loopback_the_service_will_not_start_without_a_user_identity(host):
    with pytest.raises(ValueError, match="DINREC_USER_HEADER"):
        ServingSettings(host=host)
    assert ServingSettings(host=host, user_header="x-user-id").user_header == "x-user-id"
    assert ServingSettings(host=host, anonymous_users=True).anonymous_users  # said on purpose


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_on_loopback_anonymous_callers_are_the_default(host):
    assert ServingSettings(host=host).user_header is None


def test_a_client_is_not_told_its_experiment_arm_model_or_history_length(tiny_run, tmp_path):
    """Knowing its arm, a bot clicks in one arm only and the guardrail acts on it; the operator (the admin
    token) still sees what served each answer."""
    import json

    from dinrec.serving.schemas import OPERATOR_FIELDS, RecommendResponse

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [AA]}))
    store = MemoryStore()
    store.write([BehaviourEvent(event_id="h1", user_id="u1", item_id="i1", category_id="c1", event_type="click",
                                ts=1.0)])
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", experiments_file=path,
                               admin_token=ADMIN_TOKEN)
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        asks = (("GET", {"params": {"user_id": "u1", "k": 3}}), ("POST", {"json": {"user_id": "u1", "k": 3}}))
        for method, kw in asks:
            public = c.request(method, "/recommend", **kw).json()
            assert set(public) == set(RecommendResponse.model_fields) - set(OPERATOR_FIELDS), public
            assert len(public["items"]) == 3
            seen = c.request(method, "/recommend", headers=ADMIN_HEADERS, **kw).json()
            assert set(seen) == set(RecommendResponse.model_fields)
            assert seen["experiment"] == "aa" and seen["variant"] in ("a", "b") and seen["history_len"] == 1
            assert seen["items"] == public["items"]
            wrong = c.request(method, "/recommend", headers={"authorization": "Bearer " + "0" * 32}, **kw).json()
            assert set(wrong) == set(public)  # a wrong token is a client


AA = {"name": "aa", "status": "running", "seed": "aa-seed", "variants": [{"name": "a"}, {"name": "b"}]}


def test_clients_that_click_the_moment_a_list_arrives_have_every_click_counted_once(tiny_run, tmp_path):
    """Impressions are logged off the request path, clicks written as they are posted: a client that clicks
    at once can beat its impression to the store (here every one does: impressions are held back until the
    clicks are in). Every such click is joined when its impression lands."""
    import json

    class LateImpressions(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def write(self, events, offsets=None):
            if any(e.event_type == "impression" for e in events):
                self.release.wait(30)
            return super().write(events, offsets)

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [AA]}))
    store = LateImpressions()
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store",
                               guardrail_interval_s=3600)
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        want = {"a": [0, 0, 0], "b": [0, 0, 0]}  # users, impressions, clicks
        for i in range(40):
            user = f"quick-{i}"
            a = c.get("/recommend", params={"user_id": user, "k": 4}).json()
            want[a["variant"]][0] += 1
            want[a["variant"]][1] += len(a["items"])
            want[a["variant"]][2] += 1
            click = {"event_id": f"c-{user}", "user_id": user, "item_id": a["items"][0]["item_id"],
                     "event_type": "click", "ts": time.time(), "request_id": a["request_id"]}
            assert c.post("/events", json={"events": [click]}).status_code == 202
        state = open_state(store)
        assert state.sums("aa") == {} and state.unattributed()["orphan_clicks"] == 40  # every click came first
        store.release.set()

        def counted() -> dict:
            return {v: [s.users, int(s.impressions), int(s.clicks)] for v, s in state.sums("aa").items()}

        wait_until(lambda: counted() == want, timeout_s=30, what=f"every click to be joined: {want}")
        assert state.unattributed() == {"orphan_clicks": 0, "variant_conflicts": 0, "capped": 0}


@pytest.mark.redis
@pytest.mark.kafka
def test_an_aa_experiment_counts_exactly_what_its_clients_saw_and_clicked_whatever_attackers_send(
        tiny_run, tmp_path, redis_url, kafka_bootstrap, unique):
    """Honest clients and attackers side by side, through HTTP, Kafka and Redis: the results are the
    honest clients' impressions and clicks, arm by arm, and nothing the attackers sent."""
    import json

    from dinrec.feature_store.online.redis_store import RedisStore
    from dinrec.streams.kafka_stream import KafkaStream

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [AA]}))
    store, stream = RedisStore(redis_url, prefix=unique), KafkaStream(kafka_bootstrap, unique)
    stream.ensure_topic(2)
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="stream",
                               ingest_in_app=True, guardrail_interval_s=3600)
    try:
        with live_server(settings, FeatureStoreSettings(outbox_dir=tmp_path / "outbox"), store=store,
                         stream=stream, operator=True) as c:
            users = [f"honest-{i}" for i in range(30)]
            answers = {u: c.get("/recommend", params={"user_id": u, "k": 4}).json() for u in users}
            want = {"a": [0, 0, 0], "b": [0, 0, 0]}  # users, impressions, clicks
            clicks = []
            for i, (u, a) in enumerate(answers.items()):
                want[a["variant"]][0] += 1
                want[a["variant"]][1] += len(a["items"])
                if i % 3 == 0:  # a third click their first item (twice: a double click counts once)
                    item = a["items"][0]["item_id"]
                    want[a["variant"]][2] += 1
                    clicks += [{"event_id": f"c-{u}-{n}", "user_id": u, "item_id": item, "event_type": "click",
                                "ts": time.time(), "request_id": a["request_id"]} for n in range(2)]
            victim = answers[users[0]]
            attacks = [
                # forged impressions for an arm
                [{"event_id": "f1", "user_id": "x", "item_id": "i1", "event_type": "impression", "ts": time.time(),
                  "request_id": "r-forged", "experiment": "aa", "variant": "b", "position": 0}],
                # clicks from made-up users on the victim's served list
                [{"event_id": f"f2-{n}", "user_id": f"made-up-{n}", "item_id": victim["items"][1]["item_id"],
                  "event_type": "click", "ts": time.time(), "request_id": victim["request_id"]} for n in range(20)],
                # a click that names an arm
                [{"event_id": "f3", "user_id": "y", "item_id": "i1", "event_type": "click", "ts": time.time(),
                  "experiment": "aa", "variant": "a"}],
            ]
            refused = [c.post("/events", json={"events": batch}).status_code for batch in attacks]
            assert refused[0] == refused[2] == 422 and refused[1] == 202  # the forged clicks are accepted, as
            assert c.post("/events", json={"events": clicks}).status_code == 202  # behaviours, never as A/B clicks
            state = open_state(store)

            def counted() -> dict:
                return {v: [s.users, int(s.impressions), int(s.clicks)] for v, s in state.sums("aa").items()}

            wait_until(lambda: counted() == want and state.unattributed()["orphan_clicks"] >= 20 + len(clicks) // 2,
                       timeout_s=60, what=f"the A/A counts to be what the clients saw and clicked: {want}")
            results = c.get("/experiments/aa/results").json()["results"]["variants"]
            assert {v: [int(r["users"]), int(r["impressions"]), int(r["clicks"])] for v, r in results.items()} == want
    finally:
        stream.close()
        store.flush_prefix()
        store.close()


def test_requests_queued_on_new_connections_are_shed_from_the_kernels_accept_queue(tiny_run):
    """New connections wait in the kernel, not in the worker: the cap counts that queue (TCP_INFO of the
    listening socket), so the worker answers 503 at once until the queue is under the cap."""
    store = Stalls()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store", max_in_flight=3),
                     FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        port = c.base_url.port

        def fresh(path: str) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return sock

        def answer(sock: socket.socket) -> bytes:
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            sock.close()
            return data

        first = fresh("/recommend?user_id=u0&k=3")
        assert store.reading.wait(30)
        queued = [fresh(f"/recommend?user_id=u{i}&k=3") for i in range(1, 13)]  # held by the kernel
        store.release.set()
        answers = [answer(s) for s in [first, *queued]]
        codes = [int(a.split()[1]) for a in answers]
        assert codes[0] == 200 and codes[-3:] == [200] * 3 and codes.count(503) >= 5, codes
        assert all(b"retry-after: 1" in a.lower() for a in answers if a.split()[1] == b"503")


def _closed_by_server(sock: socket.socket, bound_s: float = 20.0) -> bool:
    """Whether the server closes ``sock`` (recv reads EOF) before ``bound_s`` (read, not slept)."""
    sock.settimeout(bound_s)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("sent", [
    b"",                                                                       # connects, sends nothing
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a",                          # headers never finished
    b"POST /events HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 500\r\n\r\n{\"events\": [",                              # body never finished
])
def test_a_request_that_does_not_arrive_whole_in_time_loses_its_connection(tiny_run, sent):
    store = MemoryStore()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store", request_read_timeout_s=0.5),
                     FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        port = c.base_url.port
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(sent)
            t0 = time.monotonic()
            assert _closed_by_server(slow), "the server kept a request that never arrived whole"
            assert time.monotonic() - t0 < 10
        assert store.history("u", 10) == []
        assert c.get("/healthz").status_code == 200  # the service itself carries on
        # a slow-but-whole request within the bound is served (the timer stops once it has arrived)
        with socket.create_connection(("127.0.0.1", port)) as ok:
            ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            ok.sendall(b"\r\n")
            ok.settimeout(10)
            assert ok.recv(4096).startswith(b"HTTP/1.1 200")


def _stalled_upload(port: int) -> socket.socket:
    """A connection that sends a POST's headers and a Content-Length, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 900000\r\n\r\n")
    return sock


def test_stalled_uploads_hold_no_slot_and_are_answered_408_when_their_body_is_late(tiny_run):
    """Twice the in-flight cap of connections that sent headers and a Content-Length, then nothing: every
    /recommend beside them is still served (their bodies are awaited before a slot is taken), and each
    stalled upload gets 408 once its body is late, with its connection closed."""
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", max_in_flight=8,
                               request_body_timeout_s=3.0, max_body_reads_per_client=0)
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        port = c.base_url.port
        stalled = [_stalled_upload(port) for _ in range(16)]
        wait_until(lambda: "dinrec_arriving_bodies 16.0" in c.get("/metrics").text, timeout_s=10,
                   what="the server to be reading the 16 stalled bodies")
        t0 = time.monotonic()
        codes = [c.get("/recommend", params={"user_id": "u1", "k": 3}).status_code for _ in range(10)]
        assert codes == [200] * 10, codes
        for sock in stalled:
            sock.settimeout(20)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(4096)
                assert chunk, "closed without an answer"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower(), answer[:200]
            assert _closed_by_server(sock)
            sock.close()
        assert time.monotonic() - t0 < 20
        assert 'dinrec_refused_bodies_total{reason="slow"} 16.0' in c.get("/metrics").text


def test_one_client_may_have_only_so_many_uploads_arriving_at_once(tiny_run):
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", request_body_timeout_s=30.0,
                               max_body_reads_per_client=3)
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        port = c.base_url.port
        stalled = [_stalled_upload(port) for _ in range(3)]
        wait_until(lambda: "dinrec_arriving_bodies 3.0" in c.get("/metrics").text, timeout_s=10,
                   what="the server to be reading the 3 stalled bodies")
        refused = c.post("/events", json={"events": [{"event_id": "e1", "user_id": "u", "item_id": "i1", "ts": 5}]})
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == "too_many_uploads" and refused.headers["retry-after"] == "1"
        assert c.get("/recommend", params={"user_id": "u1", "k": 3}).status_code == 200  # no body: not limited
        for sock in stalled:
            sock.close()
        wait_until(lambda: c.post("/events", json={"events": [{"event_id": "e2", "user_id": "u", "item_id": "i1",
                                                                "ts": 5}]}).status_code == 202,
                   timeout_s=10, what="uploads to be accepted again once the stalled ones are gone")


def test_liveness_is_answered_off_the_request_loop_and_says_when_the_loop_stalls(tiny_run):
    import httpx

    from dinrec.serving.server import free_port

    health = free_port()
    with live_server(ServingSettings(bundle_dir=tiny_run[2], health_port=health, liveness_max_stall_s=0.5),
                     FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        probe = httpx.Client(base_url=f"http://127.0.0.1:{health}", timeout=5)
        r = probe.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert probe.get("/recommend").status_code == 404  # the liveness port serves nothing else
        # Block the service's event loop (as a wedged handler would): the main port cannot answer,
        # the liveness port still does, and says the loop has stalled.
        release = threading.Event()
        app_heartbeat = c.app_liveness()
        app_heartbeat.loop.call_soon_threadsafe(release.wait, 30)
        try:
            stalled = {}

            def reports_stall() -> bool:
                r = probe.get("/healthz")
                stalled.update(r.json())
                return r.status_code == 503

            wait_until(reports_stall, what="the liveness port reporting the blocked loop")
            assert stalled["status"] == "stalled" and stalled["loop_stall_s"] >= 0.5
        finally:
            release.set()
        wait_until(lambda: probe.get("/healthz").status_code == 200, what="liveness back once the loop turns")
        assert c.get("/healthz").status_code == 200
        probe.close()
