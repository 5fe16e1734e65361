"""Per-user event quotas at POST /events: one user id cannot flood the stream, the store or the next
training set; a person, other users and the operator are not held back."""

from __future__ import annotations

import math

import pytest

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.quotas import UserQuota
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.serving.conftest import live_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_refills_with_time_and_a_request_is_taken_whole_or_not_at_all():
    clock = Clock()
    quota = UserQuota(60, max_users=3, clock=clock)  # one a second, a minute's worth at most
    assert quota.take({"u": 60}) == 0.0
    assert quota.take({"u": 1}) == pytest.approx(1.0)
    assert quota.take({"v": 10, "u": 5}) == pytest.approx(5.0)  # refused whole: v spent nothing either
    clock.now += 5
    assert quota.take({"v": 60, "u": 5}) == 0.0
    assert quota.take({"w": 61}) == math.inf  # more than a bucket holds: never
    clock.now += 3600
    assert quota.take({"u": 60}) == 0.0  # full again, not more than full
    assert quota.take({"u": 1}) > 0
    for user in ("a", "b", "c"):  # the least recently seen are forgotten: memory is bounded
        quota.take({user: 1})
    assert len(quota) == 3 and quota.take({"u": 60}) == 0.0  # u was forgotten: a full bucket again
    clock.now += 60  # a minute on every bucket is full again: all forgotten but the one touched now
    quota.take({"d": 1})
    assert len(quota) == 1


def test_a_user_over_its_quota_is_answered_429_and_nothing_of_the_request_is_kept(tiny_run):
    store = MemoryStore()
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", events_per_user_per_minute=60)

    def events(user: str, n: int, tag: str) -> dict:
        return {"events": [{"event_id": f"{tag}-{j}", "user_id": user, "item_id": f"i{j}", "event_type": "view",
                            "ts": 1.7e9 + j} for j in range(n)]}

    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        assert c.post("/events", json=events("flood", 60, "a")).status_code == 202
        before = store.applied_behaviours()
        r = c.post("/events", json={"events": events("flood", 2, "b")["events"] + events("person", 1, "p")["events"]})
        assert r.status_code == 429 and r.json()["error"] == "too_many_requests"
        assert 1 <= int(r.headers["retry-after"]) <= 2 and "nothing was accepted" in r.json()["message"]
        assert store.applied_behaviours() == before and store.history("person", 5) == []  # refused whole
        assert c.post("/events", json=events("person", 1, "p")).status_code == 202  # other users go on
        big = c.post("/events", json=events("other", 61, "d"))
        assert big.status_code == 429 and "retry-after" not in big.headers and "over time" in big.json()["message"]
        assert 'dinrec_events_over_quota_total 2.0' in c.get("/metrics").text


def test_the_operator_is_not_counted(tiny_run):
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", events_per_user_per_minute=10)
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream(),
                     operator=True) as c:
        r = c.post("/events", json={"events": [{"event_id": f"e{j}", "user_id": "u", "item_id": "i", "ts": 1.7e9}
                                               for j in range(100)]})
        assert r.status_code == 202
