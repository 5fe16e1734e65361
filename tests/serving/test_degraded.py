"""Redis stopped under a request stream: every answer is a 200 (degraded while it is down), and the
service recovers by itself once Redis is back. A redis-server of the test's own, since it is killed."""

from __future__ import annotations

import threading
import time

import pytest

from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import wait_until
from tests.serving.conftest import live_server

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_redis_down_mid_stream_degrades_then_recovers(own_redis, tiny_run, unique):
    seeding = RedisStore(own_redis.url, prefix=unique)  # the default timeout: one big write on a busy host
    seeding.write(list(tiny_run[0].events()))
    seeding.close()
    store = RedisStore(own_redis.url, prefix=unique, socket_timeout_s=0.1)  # the service's: fails fast
    own_redis.save()  # it comes back with the histories
    users = sorted(set(tiny_run[0].user_id.tolist()))[:20]
    answers: list[tuple[float, int, bool, str, float]] = []  # (when, status, degraded, strategy, seconds)
    stop = threading.Event()
    settings = ServingSettings(bundle_dir=tiny_run[2], store_cooldown_s=0.5, events_sink="store")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        def stream() -> None:
            i = 0
            while not stop.is_set():
                t0 = time.monotonic()
                r = c.get("/recommend", params={"user_id": users[i % len(users)], "k": 5})
                body = r.json()
                answers.append((t0, r.status_code, body.get("degraded", False), body.get("strategy", ""),
                                time.monotonic() - t0))
                i += 1

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(1.5)
        killed_at = time.monotonic()
        own_redis.kill()
        time.sleep(3)
        restarting_at = time.monotonic()
        own_redis.start()
        back_at = time.monotonic()
        wait_until(lambda: any(a[0] > back_at and not a[2] for a in answers), timeout_s=30,
                   what="a non-degraded answer after Redis came back")
        time.sleep(max(0.0, back_at + 3 - time.monotonic()))
        stop.set()
        t.join(timeout=30)
    store.close()
    assert {a[1] for a in answers} == {200}
    before = [a for a in answers if a[0] + a[4] < killed_at]  # answered before the kill
    during = [a for a in answers if killed_at + 0.2 < a[0] < restarting_at]
    after = [a for a in answers if a[0] > back_at + 2]  # past the cool-down and the probe
    assert before and all(not a[2] and a[3] == "din" for a in before)
    assert len(during) > 20 and all(a[2] for a in during)
    assert after and all(not a[2] and a[3] == "din" for a in after)
    assert max(a[4] for a in during) < 1.0  # an outage costs a request at most one short timeout


_BUSY_SCRIPT = """
local t0 = redis.call('TIME')
local start = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
while true do
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > tonumber(ARGV[1]) then return 1 end
end
"""


def test_a_store_slower_than_the_deadline_gets_a_popular_answer_not_a_late_ranking(own_redis, tiny_run, unique):
    import redis

    store = RedisStore(own_redis.url, prefix=unique, socket_timeout_s=3.0)  # slow, but within its own timeout
    store.write(list(tiny_run[0].events()))
    user = sorted(set(tiny_run[0].user_id.tolist()))[0]
    settings = ServingSettings(bundle_dir=tiny_run[2], request_deadline_ms=150, events_sink="store")
    blocker = redis.Redis.from_url(own_redis.url)
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        fresh = c.get("/recommend", params={"user_id": user, "k": 5}).json()
        assert not fresh["degraded"] and fresh["strategy"] == "din"
        # A real slow Redis: a script that keeps the server busy for 0.6 s, so the history read waits.
        busy = threading.Thread(target=blocker.eval, args=(_BUSY_SCRIPT, 0, 600_000))
        busy.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        r = c.get("/recommend", params={"user_id": user, "k": 5})
        took = time.monotonic() - t0
        busy.join(timeout=10)
        body = r.json()
        assert r.status_code == 200 and took > 0.3  # it did wait on the store
        assert body["degraded"] and body["degraded_reasons"] == ["deadline"] and body["strategy"] == "popular"
        assert len(body["items"]) == 5 and body["history_len"] > 0  # the history came, too late to rank on
        seen = {h.item_id for h in store.history(user, 1000)}
        assert not seen & {x["item_id"] for x in body["items"]}  # still not the user's own items
        again = c.get("/recommend", params={"user_id": user, "k": 5}).json()
        assert not again["degraded"] and again["strategy"] == "din"  # nothing stays broken
        metrics = c.get("/metrics").text
        assert 'dinrec_degraded_responses_total{reason="deadline"} 1.0' in metrics
    blocker.close()
    store.close()
