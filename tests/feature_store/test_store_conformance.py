"""One contract, every backend: the embedded memory store and a real Redis server."""

from __future__ import annotations

import pytest

from feature_store.errors import StoreUnavailable
from feature_store.online.redis_store import RedisStore
from feature_store.schema import BehaviourEvent
from tests.conftest import online_store


@pytest.fixture(params=["memory", "redis"])
def store(request, unique):
    yield from online_store(request.param, request, unique, history_cap=5)


def ev(user: str, item: str, ts: float, eid: str | None = None, **kw) -> BehaviourEvent:
    return BehaviourEvent(event_id=eid or f"{user}-{item}-{ts}", user_id=user, item_id=item,
                          category_id=f"c{item}", ts=ts, **kw)


def test_history_is_time_ordered_whatever_the_arrival_order(store):
    store.write([ev("u", "3", 30), ev("u", "1", 10)])
    store.write([ev("u", "2", 20)])
    hist = store.history("u", 10)
    assert [h.item_id for h in hist] == ["1", "2", "3"]
    assert [h.category_id for h in hist] == ["c1", "c2", "c3"]
    assert [h.ts for h in hist] == [10.0, 20.0, 30.0]


def test_capped_to_newest_and_limit_takes_the_newest(store):
    store.write([ev("u", str(i), float(i)) for i in range(8)])
    assert [h.item_id for h in store.history("u", 100)] == ["3", "4", "5", "6", "7"]
    assert [h.item_id for h in store.history("u", 2)] == ["6", "7"]
    store.write([ev("u", "old", 0.5)])  # older than everything kept: trimmed at once
    assert [h.item_id for h in store.history("u", 100)] == ["3", "4", "5", "6", "7"]


def test_redelivery_is_idempotent_and_popularity_counts_once(store):
    batch = [ev("u", "a", 1), ev("v", "a", 2), ev("v", "b", 3)]
    assert store.write(batch) == 3
    assert store.write(batch) == 0
    assert store.popular(10) == [("a", 2.0), ("b", 1.0)]
    assert len(store.history("v", 10)) == 2


def test_only_behaviours_enter_history(store):
    store.write([ev("u", "seen", 1, event_type="impression"), ev("u", "meh", 2, event_type="rate", value=2),
                 ev("u", "liked", 3, event_type="rate", value=5)])
    assert [h.item_id for h in store.history("u", 10)] == ["liked"]


def test_many_users_in_one_read_and_unknown_users_are_empty(store):
    store.write([ev("a", "1", 1), ev("b", "2", 2)])
    got = store.histories(["a", "b", "nobody"], 10)
    assert {u: [h.item_id for h in hs] for u, hs in got.items()} == {"a": ["1"], "b": ["2"], "nobody": []}
    assert store.history("a", 0) == []


def test_same_timestamp_ties_break_by_event_id(store):
    store.write([ev("u", "x", 5, eid="e2"), ev("u", "y", 5, eid="e1")])
    assert [h.event_id for h in store.history("u", 10)] == ["e1", "e2"]


def test_unreachable_redis_raises_the_projects_error():
    s = RedisStore("redis://127.0.0.1:1/0", socket_timeout_s=0.2)
    with pytest.raises(StoreUnavailable, match="not reachable"):
        s.ping()
    with pytest.raises(StoreUnavailable):
        s.write([ev("u", "1", 1)])


def test_redis_layout_matches_golden_file(redis_url, unique):
    """Pins the storage format: a change here breaks every running deployment's data."""
    import json
    from pathlib import Path

    import redis

    golden = json.loads((Path(__file__).parents[1] / "golden" / "redis_layout.json").read_text()
                        .replace("PREFIX", unique))
    s = RedisStore(redis_url, prefix=unique)
    try:
        s.write([BehaviourEvent(event_id="e-2", user_id="u1", item_id="i3", category_id="c1", ts=1700000005.0),
                 BehaviourEvent(event_id="e-1", user_id="u1", item_id="i9", category_id="c2", ts=1700000000.0)])
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        assert sorted(r.scan_iter(f"{unique}:*")) == sorted([golden["hist_key"], golden["pop_key"]])
        assert [list(x) for x in r.zrange(golden["hist_key"], 0, -1, withscores=True)] == golden["hist_members"]
        assert [list(x) for x in r.zrange(golden["pop_key"], 0, -1, withscores=True)] == golden["pop_members"]
        r.close()
    finally:
        s.flush_prefix()
        s.close()
