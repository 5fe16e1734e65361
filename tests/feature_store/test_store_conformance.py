"""One contract, every backend: the embedded memory store and a real Redis server."""

from __future__ import annotations

import pytest

from dinrec.events.partitioning import partition_of
from dinrec.events.schema import BehaviourEvent
from dinrec.experiments import open_state
from dinrec.feature_store.errors import OffsetConflict, StoreUnavailable
from dinrec.feature_store.online.base import StreamOffsets
from dinrec.feature_store.online.redis_store import RedisStore
from tests.conftest import STORE_KINDS, online_store


class Clock:
    """A settable clock, so tests can step past the dedup window."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=STORE_KINDS)
def store(request, unique, clock):
    """Popularity and the catalog take an item on its first behaviour (catalog_min_users=1: admission is
    tried on its own, with the default, below)."""
    yield from online_store(request.param, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                            catalog_min_users=1)


@pytest.fixture(params=STORE_KINDS)
def small_store(request, unique, clock):
    """History cap 3, as in the report that found late duplicates counted twice."""
    yield from online_store(request.param, request, unique, history_cap=3, dedup_window_s=3600, clock=clock,
                            catalog_min_users=1)


@pytest.fixture(params=STORE_KINDS)
def admitting_store(request, unique, clock):
    """The default admission: an item clients name needs 3 users (a user once a day)."""
    yield from online_store(request.param, request, unique, history_cap=5, dedup_window_s=3600, clock=clock)


def ev(user: str, item: str, ts: float, eid: str | None = None, **kw) -> BehaviourEvent:
    return BehaviourEvent(event_id=eid or f"{user}-{item}-{ts}", user_id=user, item_id=item,
                          **{"category_id": f"c{item}", **kw}, ts=ts)


def test_history_is_time_ordered_whatever_the_arrival_order(store):
    store.write([ev("u", "3", 30), ev("u", "1", 10)])
    store.write([ev("u", "2", 20)])
    hist = store.history("u", 10)
    assert [h.item_id for h in hist] == ["1", "2", "3"]
    assert [h.category_id for h in hist] == ["c1", "c2", "c3"]
    assert [h.ts for h in hist] == [10.0, 20.0, 30.0]


@pytest.fixture(params=STORE_KINDS)
def items_store(request, unique, clock):
    """History cap 3, interacted cap 4: the seen-item set outlives the history, within its own cap."""
    yield from online_store(request.param, request, unique, history_cap=3, dedup_window_s=3600, clock=clock,
                            interacted_cap=4)


def test_interacted_items_outlive_the_history_within_their_cap(items_store):
    s = items_store
    s.write([ev("u", "a", 1), ev("u", "b", 2), ev("u", "c", 3), ev("u", "d", 4)])
    assert [h.item_id for h in s.history("u", 10)] == ["b", "c", "d"]  # the history forgot "a"
    assert s.interacted(["u", "nobody"]) == {"u": frozenset("abcd"), "nobody": frozenset()}
    s.write([ev("u", "a", 5, eid="again"), ev("u", "e", 6)])  # "a" taken again: newest again, "b" drops
    assert s.interacted(["u"])["u"] == frozenset("acde")
    s.write([ev("u", "b", 0.5, eid="late")])  # an old behaviour arriving late is older than all four kept
    assert s.interacted(["u"])["u"] == frozenset("acde")
    assert s.history_and_interacted("u", 2) == (s.history("u", 2), frozenset("acde"))
    assert s.write([ev("u", "e", 6)]) == 0  # a redelivery changes nothing
    assert s.interacted(["u"])["u"] == frozenset("acde")
    s.write([BehaviourEvent(event_id="low", user_id="u", item_id="z", ts=7.0, event_type="rate", value=1.0)])
    assert "z" not in s.interacted(["u"])["u"]  # what is not a behaviour is not "taken"


@pytest.mark.parametrize("backend", STORE_KINDS)
def test_an_interacted_cap_below_the_history_cap_still_holds(backend, request, unique, clock):
    # Redis trims the interacted items only once the history overflows — unless their cap is the smaller.
    for s in online_store(backend, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                          interacted_cap=2):
        s.write([ev("u", "a", 1), ev("u", "b", 2), ev("u", "c", 3)])
        assert len(s.history("u", 10)) == 3 and s.interacted(["u"])["u"] == frozenset("bc")


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


def test_a_late_duplicate_of_a_trimmed_event_is_not_applied_again(small_store):
    old = ev("u", "old", 1.0)
    assert small_store.write([old]) == 1
    assert small_store.write([ev("u", str(i), 10.0 + i) for i in range(3)]) == 3  # trims "old" out
    assert "old" not in [h.item_id for h in small_store.history("u", 10)]
    assert small_store.write([old]) == 0
    assert dict(small_store.popular(10))["old"] == 1.0
    assert [h.item_id for h in small_store.history("u", 10)] == ["0", "1", "2"]


def test_dedup_holds_for_the_window_and_only_the_window(small_store, clock):
    old = ev("u", "old", 1.0)
    small_store.write([old])
    small_store.write([ev("u", str(i), 10.0 + i) for i in range(3)])
    clock.now += 3599
    assert small_store.write([old]) == 0
    clock.now += 3602  # past the window of the first application (the redelivery did not renew it)
    small_store.write([ev("u", "other", 50.0)])  # expiry runs on the user's writes
    assert small_store.write([old]) == 1  # documented: a duplicate later than the window counts again
    assert small_store.applied_behaviours() == 6
    assert dict(small_store.popular(10))["old"] == 1.0  # popularity: the (user, item) once a day, still


def test_an_expired_entry_still_in_the_history_is_not_counted_again(store, clock):
    e = ev("u", "a", 5.0)
    store.write([e])
    clock.now += 7201
    assert store.write([e]) == 0
    assert store.popular(10) == [("a", 1.0)]


def test_same_event_id_within_one_batch_counts_once(store):
    e = ev("u", "a", 5.0)
    assert store.write([e, e, ev("u", "b", 6.0)]) == 2
    assert store.popular(10) == [("a", 1.0), ("b", 1.0)]


def test_offsets_are_written_with_the_events_or_not_at_all(store):
    # "u"'s events are of its partition; "other" is another one (another shard where the store has several).
    mine = partition_of("u", store.partitions) if store.partitions > 1 else 0
    other, never = (mine + 1) % max(store.partitions, 3), (mine + 2) % max(store.partitions, 3)
    first = StreamOffsets("topic-a", expected={mine: -1, other: -1}, last={mine: 4, other: 9})
    assert store.write([ev("u", "a", 1)], first) == 1
    assert store.stream_offsets("topic-a") == {mine: 4, other: 9}
    assert store.stream_offsets("topic-b") == {}
    # A writer that believes u's partition is at 3 (the store says 4) is refused, and nothing it sent lands.
    with pytest.raises(OffsetConflict) as info:
        store.write([ev("u", "b", 2)],
                    StreamOffsets("topic-a", expected={mine: 3, other: 9}, last={mine: 6, other: 12}))
    assert info.value.stored == {mine: 4}
    assert [h.item_id for h in store.history("u", 10)] == ["a"]
    # The other partition is in the same atomic step on a one-shard store (refused with it), in its own on a
    # sharded one (applied: a consumer learns it from the store's offsets, as after any conflict).
    assert store.stream_offsets("topic-a") == {mine: 4, other: 9 if store.partitions == 1 else 12}
    # A batch of only invalid records still moves the offsets.
    assert store.write([], StreamOffsets("topic-a", expected={mine: 4}, last={mine: 5})) == 0
    assert store.stream_offsets("topic-a")[mine] == 5
    with pytest.raises(OffsetConflict) as info:
        store.write([ev("u", "c", 3)], StreamOffsets("topic-a", expected={never: 0}, last={never: 1}))
    assert info.value.stored == {never: -1}


def test_stream_offsets_must_move_forward():
    with pytest.raises(ValueError, match="not after"):
        StreamOffsets("t", expected={0: 5}, last={0: 5})
    with pytest.raises(ValueError, match="same partitions"):
        StreamOffsets("t", expected={0: 5}, last={1: 6})


def test_a_corrupt_member_is_skipped_not_fatal(redis_url, unique):
    import redis

    s = RedisStore(redis_url, prefix=unique)
    try:
        s.write([ev("u", "good", 2.0)])
        r = redis.Redis.from_url(redis_url)
        r.zadd(f"{unique}:{{0}}:hist:u", {b"e\x1fbad\x1fsep\x1fc": 1.0})  # as an unvalidated old writer could
        r.close()
        assert [h.item_id for h in s.history("u", 10)] == ["good"]
    finally:
        s.flush_prefix()
        s.close()


def test_unreachable_redis_raises_the_projects_error_without_the_password():
    s = RedisStore("redis://admin:hunter2-pw@127.0.0.1:1/0", socket_timeout_s=0.2)
    with pytest.raises(StoreUnavailable, match="not reachable") as down:
        s.ping()
    assert "redis://127.0.0.1:1/0" in str(down.value) and "hunter2" not in str(down.value)
    with pytest.raises(StoreUnavailable) as failed:
        s.write([ev("u", "1", 1)])
    assert "hunter2" not in str(failed.value) and "admin" not in str(failed.value)


def test_redis_layout_matches_golden_file(redis_url, unique):
    """Pins the storage format: a change here breaks every running deployment's data. Four partitions:
    user u1 is partition 2 (CRC-32), so every key of its batch carries the hash tag {2}."""
    import json
    from pathlib import Path

    import redis

    golden = json.loads((Path(__file__).parents[1] / "golden" / "redis_layout.json").read_text()
                        .replace("PREFIX", unique))
    assert partition_of("u1", golden["partitions"]) == 2
    s = RedisStore(redis_url, prefix=unique, clock=lambda: 1700000100.0, partitions=golden["partitions"],
                   catalog_min_users=1)
    try:
        s.write([BehaviourEvent(event_id="e-2", user_id="u1", item_id="i3", category_id="c1", ts=1700000005.0),
                 BehaviourEvent(event_id="e-1", user_id="u1", item_id="i9", category_id="c2", ts=1700000000.0)],
                StreamOffsets("dinrec.events", expected={2: -1}, last={2: 41}))
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        assert sorted(r.scan_iter(f"{unique}:*")) == sorted(
            [golden["hist_key"], golden["pop_key"], golden["seen_key"], golden["items_key"], golden["offsets_key"],
             golden["catalog_key"], golden["catalog_order_key"], golden["layout_key"], golden["pc_key"],
             golden["applied_key"]])
        assert [list(x) for x in r.zrange(golden["pc_key"], 0, -1, withscores=True)] == golden["pc_members"]
        assert r.get(golden["applied_key"]) == golden["applied"]
        assert [list(x) for x in r.zrange(golden["hist_key"], 0, -1, withscores=True)] == golden["hist_members"]
        assert [list(x) for x in r.zrange(golden["pop_key"], 0, -1, withscores=True)] == golden["pop_members"]
        assert [list(x) for x in r.zrange(golden["seen_key"], 0, -1, withscores=True)] == golden["seen_members"]
        assert [list(x) for x in r.zrange(golden["items_key"], 0, -1, withscores=True)] == golden["items_members"]
        assert r.hgetall(golden["offsets_key"]) == golden["offsets"]
        assert r.hgetall(golden["catalog_key"]) == golden["catalog"]
        assert sorted(r.lrange(golden["catalog_order_key"], 0, -1)) == sorted(golden["catalog"])
        assert r.hgetall(golden["layout_key"]) == golden["layout"]
        assert 0 < r.ttl(golden["seen_key"]) <= 24 * 3600
        r.close()
    finally:
        s.flush_prefix()
        s.close()


def test_a_prefix_in_another_layout_is_refused_not_read(redis_url, unique):
    import redis

    from dinrec.feature_store.errors import StoreLayoutError

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    four = RedisStore(redis_url, prefix=unique, partitions=4)
    try:
        four.write([ev("u", "a", 1.0)])
        with pytest.raises(StoreLayoutError, match="4 partitions.*configured for layout 2 with 1"):
            RedisStore(redis_url, prefix=unique).history("u", 5)  # would look in the wrong shard
        r.zadd(f"{unique}-old:pop", {"a": 1.0})  # what dinrec wrote before hash tags (layout 1)
        old = RedisStore(redis_url, prefix=f"{unique}-old")
        with pytest.raises(StoreLayoutError, match="holds layout 1"):
            old.write([ev("u", "b", 2.0)])
        assert r.zcard(f"{unique}-old:pop") == 1 and not r.exists(f"{unique}-old:layout")  # nothing written
        old.flush_prefix()
    finally:
        four.flush_prefix()
        four.close()
        r.close()


def imp(user: str, item: str, req: str, variant: str, ts: float = 1.0, exp: str = "exp1") -> BehaviourEvent:
    return BehaviourEvent(event_id=f"imp-{req}-{item}", user_id=user, item_id=item, ts=ts, event_type="impression",
                          request_id=req, experiment=exp, variant=variant, position=0)


def click(user: str, item: str, req: str, ts: float = 2.0, eid: str | None = None) -> BehaviourEvent:
    return BehaviourEvent(event_id=eid or f"clk-{req}-{item}", user_id=user, item_id=item, ts=ts, event_type="click",
                          request_id=req)


@pytest.mark.parametrize("backend", STORE_KINDS)
def test_what_one_user_adds_to_an_experiment_is_capped(backend, request, unique, clock):
    """A bot shown 5 lists that clicks everything adds 3 impressions and 3 clicks (``ab_user_cap``); the rest
    is counted apart, and a person beside it counts whole."""
    store = next(online_store(backend, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                              ab_user_cap=3))
    state = open_state(store)
    store.write([e for j in range(5) for e in (imp("bot", f"i{j}", f"r{j}", "A"), click("bot", f"i{j}", f"r{j}"))])
    store.write([imp("person", "i0", "p0", "A"), click("person", "i0", "p0")])
    a = state.sums("exp1")["A"]
    assert (a.users, a.impressions, a.clicks, a.impressions_sq, a.clicks_sq) == (2, 4, 4, 9 + 1, 9 + 1)
    assert state.unattributed() == {"orphan_clicks": 0, "variant_conflicts": 0, "capped": 4}
    if backend != "memory":
        store.flush_prefix()
        store.close()


def test_experiment_sums_count_each_impression_and_attributed_click_once(store):
    state = open_state(store)
    events = [imp("u1", "a", "r1", "A"), imp("u1", "b", "r1", "A"), imp("u1", "c", "r2", "A"),
              imp("u2", "a", "r3", "B"), imp("u2", "b", "r3", "B"),
              click("u1", "a", "r1"), click("u1", "c", "r2"), click("u2", "b", "r3")]
    assert store.write(events) == 8
    assert store.write(events) == 0  # redelivered: nothing counts twice
    store.write(events[3:6])  # a partial redelivery too
    sums = state.sums("exp1")
    a, b = sums["A"], sums["B"]
    # u1: 3 impressions, 2 clicks; u2: 2 impressions, 1 click.
    assert (a.users, a.impressions, a.clicks, a.impressions_sq, a.clicks_sq, a.cross) == (1, 3, 2, 9, 4, 6)
    assert (b.users, b.impressions, b.clicks, b.impressions_sq, b.clicks_sq, b.cross) == (1, 2, 1, 4, 1, 2)
    assert state.unattributed() == {"orphan_clicks": 0, "variant_conflicts": 0, "capped": 0}
    assert [h.item_id for h in store.history("u1", 10)] == ["a", "c"]  # clicks are history, impressions not
    assert state.sums("no-such-experiment") == {}


def conversion(user: str, item: str, kind: str = "buy", ts: float = 3.0, value: float | None = None,
               eid: str | None = None) -> BehaviourEvent:
    return BehaviourEvent(event_id=eid or f"{kind}-{user}-{item}-{ts}", user_id=user, item_id=item, ts=ts,
                          event_type=kind, value=value)


def test_buys_and_carts_count_for_the_experiments_their_user_was_exposed_to_once(store):
    """A buy or cart after a user's first exposure is a conversion under their variant, in every experiment they
    were exposed to, once however often redelivered; before it, it is only behaviour — and part of the
    pre-exposure count kept as CUPED's covariate (the history's length then, at most the cap: 5 here)."""
    state = open_state(store)
    store.write([conversion("u1", "a", ts=0.5, value=99.0), ev("u1", "b", 0.6)])  # before any exposure
    store.write([imp("u1", "x", "r1", "A"), imp("u1", "y", "r1", "A"), imp("u1", "x", "q1", "T", exp="exp2"),
                 imp("u2", "x", "r2", "B")])
    later = [conversion("u1", "c", value=10.0), conversion("u1", "d", value=2.5), conversion("u1", "e", "cart"),
             conversion("u2", "c", value=-4.0),  # a refund is no value: the buy counts, its value does not
             conversion("u3", "c", value=7.0)]  # never exposed: behaviour only
    store.write(later)
    store.write(later)  # redelivered: nothing counts twice
    sums = state.sums("exp1")
    a, b = sums["A"], sums["B"]
    assert (a.users, a.impressions, a.buys, a.buys_sq, a.impressions_buys, a.carts, a.carts_sq) == (1, 2, 2, 4, 4, 1, 1)
    assert (a.value, a.value_sq) == pytest.approx((12.5, 12.5**2))
    assert (a.pre, a.pre_sq, a.pre_impressions, a.pre_buys, a.pre_carts) == (2, 4, 4, 4, 2)
    assert a.pre_value == pytest.approx(2 * 12.5)
    assert (b.users, b.buys, b.value, b.pre, b.impressions_buys) == (1, 1, 0.0, 0, 1)
    t = state.sums("exp2")["T"]  # u1 is in exp2 too: its conversions count there as well
    assert (t.users, t.buys, t.carts, t.pre) == (1, 2, 1, 2)
    assert t.value == pytest.approx(12.5)
    assert state.unattributed() == {"orphan_clicks": 0, "variant_conflicts": 0, "capped": 0}
    assert {h.item_id for h in store.history("u3", 10)} == {"c"}


@pytest.mark.parametrize("backend", STORE_KINDS)
def test_what_one_user_converts_is_capped_in_count_and_value(backend, request, unique, clock):
    """A bot that buys 5 times adds 3 buys (``ab_user_cap``) and at most ``ab_value_cap`` of value; the rest is
    counted apart."""
    store = next(online_store(backend, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                              ab_user_cap=3, ab_value_cap=100.0))
    state = open_state(store)
    store.write([imp("bot", "i0", "r0", "A"), imp("person", "i0", "p0", "A")])
    store.write([conversion("bot", f"b{j}", value=60.0) for j in range(5)] + [conversion("person", "b0", value=30.0)])
    a = state.sums("exp1")["A"]
    assert (a.users, a.buys, a.buys_sq) == (2, 4, 9 + 1)
    assert a.value == pytest.approx(100.0 + 30.0) and a.value_sq == pytest.approx(100.0**2 + 30.0**2)
    # two buys past the count cap; of the three counted, two had value past the value cap (the second in part)
    assert state.unattributed()["capped"] == 2 + 2
    if backend != "memory":
        store.flush_prefix()
        store.close()


def test_clicks_without_a_logged_impression_are_counted_apart(store):
    state = open_state(store)
    store.write([imp("u1", "a", "r1", "A")])
    store.write([click("u1", "z", "r1"),  # shown nothing called z in r1
                 click("u1", "a", "r-unknown"),  # a request never logged
                 BehaviourEvent(event_id="plain", user_id="u1", item_id="a", ts=3.0, event_type="click")])
    assert state.unattributed()["orphan_clicks"] == 2  # the plain click (no request id) is no experiment click
    assert state.sums("exp1")["A"].clicks == 0
    store.write([imp("u1", "b", "r9", "B")])  # the same user under another variant: not mixed in
    assert state.unattributed()["variant_conflicts"] == 1 and "B" not in state.sums("exp1")


def test_a_click_counts_once_and_only_for_the_user_it_was_shown_to(store):
    state = open_state(store)
    store.write([imp("victim", "a", "r1", "A"), imp("victim", "b", "r1", "A")])
    # 50 made-up users click the victim's item with its request id: none joins the arm, none counts.
    store.write([click(f"forger{i}", "a", "r1", eid=f"forged-{i}") for i in range(50)])
    a = state.sums("exp1")["A"]
    assert (a.users, a.impressions, a.clicks) == (1, 2, 0)
    assert state.unattributed()["orphan_clicks"] == 50
    # The victim's own clicks: the first on each shown item counts; clicking again (a fresh event id) does not.
    store.write([click("victim", "a", "r1", ts=3.0, eid="c1"), click("victim", "a", "r1", ts=4.0, eid="c2"),
                 click("victim", "b", "r1", ts=5.0, eid="c3")])
    a = state.sums("exp1")["A"]
    assert (a.users, a.impressions, a.clicks) == (1, 2, 2)
    assert state.unattributed()["orphan_clicks"] == 51
    assert [h.item_id for h in store.history("victim", 10)] == ["a", "a", "b"]  # every click is still history


def test_a_click_that_outruns_its_impression_is_joined_when_the_impression_lands(store, clock):
    """Impressions are logged off the request path, so a client that clicks at once can be first: the
    click waits (an orphan until then) and is counted for its arm when its impression arrives — once,
    and only for the user it was shown to; one whose impression never comes within the window stays apart."""
    state = open_state(store)
    store.write([click("u1", "a", "r1"), click("u1", "a", "r1", ts=2.5, eid="again"),
                 click("thief", "b", "r1", eid="t1"), click("u1", "c", "r2")])
    assert state.unattributed()["orphan_clicks"] == 4 and state.sums("exp1") == {}
    store.write([imp("u1", "a", "r1", "A"), imp("u1", "b", "r1", "A")])
    a = state.sums("exp1")["A"]
    assert (a.users, a.impressions, a.clicks) == (1, 2, 1)  # a: joined once; b was clicked by another user
    assert state.unattributed()["orphan_clicks"] == 3
    store.write([click("u1", "b", "r1", ts=3.0, eid="late-own")])  # the user's own click on b, after it
    assert state.sums("exp1")["A"].clicks == 2 and state.unattributed()["orphan_clicks"] == 3
    clock.now += 3600 + 1  # past the window: r2's click no longer waits for its impression
    store.write([imp("u1", "c", "r2", "A")])
    assert state.sums("exp1")["A"].clicks == 2 and state.unattributed()["orphan_clicks"] == 3


@pytest.mark.parametrize("backend", STORE_KINDS)
def test_the_click_join_keeps_per_request_state_for_the_attribution_window_only(backend, request, unique, clock):
    """A click joins its impression within ``attribution_window_s`` (60 s here), either may come first;
    later it is an orphan, and what the join kept per request is gone — a day's experiment answers must
    not hold a day of keys (the dedup window, an hour here, is not the join's)."""
    store = next(online_store(backend, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                              attribution_window_s=60, catalog_min_users=1))
    state = open_state(store)
    store.write([imp("u1", "a", "r1", "A"), imp("u1", "b", "r1", "A"), click("u1", "c", "r2")])
    clock.now += 30
    store.write([click("u1", "a", "r1")])  # within the window: attributed
    assert state.sums("exp1")["A"].clicks == 1 and state.unattributed()["orphan_clicks"] == 1
    clock.now += 31
    store.write([click("u1", "b", "r1"), imp("u1", "c", "r2", "A")])  # 61 s after each other: no join
    assert state.sums("exp1")["A"].clicks == 1 and state.unattributed()["orphan_clicks"] == 2
    if store.backend == "memory":
        clock.now += 61
        store.write([ev("someone", "i1", 1.0)])  # any write lets the embedded store drop what expired
        assert not store._att and not store._pending
    else:
        r = store.client
        keys = [k for k in r.scan_iter(f"{store.prefix}:*") if ":att:" in k or ":pend:" in k]
        assert keys and all(0 < r.ttl(k) <= 60 for k in keys)
        store.flush_prefix()
        store.close()
    with pytest.raises(ValueError, match="attribution_window_s"):
        next(online_store(backend, request, unique, history_cap=5, attribution_window_s=0.5))


def test_stop_decisions_and_snapshots_keep_the_first_writer(store):
    state = open_state(store)
    assert state.stop("exp1", "B", {"at": 1.0, "lift": -0.2}) is True
    assert state.stop("exp1", "B", {"at": 2.0, "lift": -0.3}) is False  # another replica, later: ignored
    assert state.stopped("exp1") == {"B": {"at": 1.0, "lift": -0.2}} and state.stopped("exp2") == {}
    assert state.snapshot("exp1", 11, {"t": 11.5}) and state.snapshot("exp1", 10, {"t": 10.5})
    assert not state.snapshot("exp1", 11, {"t": 11.9})
    assert state.timeline("exp1") == [{"t": 10.5}, {"t": 11.5}]  # oldest first, first writer kept
    # Two weeks at a 10-minute interval: the last day at that interval, one an hour before it.
    for k in range(14 * 144):
        state.snapshot("exp3", k, {"t": 600.0 * k + 1})
    kept = state.timeline("exp3")
    last = 600.0 * (14 * 144 - 1) + 1
    assert [d["t"] for d in kept] == sorted(d["t"] for d in kept) and kept[-1]["t"] == last
    recent = [d for d in kept if d["t"] >= last - 86_400]
    # Before the last day: an hour apart (and the up to 6 interval snapshots of the hour since the last drop).
    assert len(recent) == 145 and 13 * 24 <= len(kept) - len(recent) <= 13 * 24 + 6
    assert all(b["t"] - a["t"] == 3600 for a, b in zip(kept[:300], kept[1:300], strict=False))
    for step in (1, 0, 1, 2):  # steps 0 and 1 reached; a second replica's step 1 is ignored
        state.ramp("exp1", step, {"step": step, "at": float(10 * step + len(state.ramp_log("exp1")))})
    assert state.ramp_log("exp1") == [{"step": 0, "at": 1.0}, {"step": 1, "at": 10.0}, {"step": 2, "at": 22.0}]
    assert state.conclusion("exp1") is None and state.ramp_log("exp2") == []
    assert state.conclude("exp1", {"winner": "B"}) and not state.conclude("exp1", {"winner": "C"})
    assert state.conclusion("exp1") == {"winner": "B"} and state.conclusion("exp2") is None


def one_shard(store, name: str) -> str:
    """``name``, suffixed until it is in shard 0: a sharded store judges a click's long tail by the popularity
    among the users of the clicking user's shard, so these tests put every user in one."""
    if store.partitions == 1:
        return name
    return next(f"{name}.{k}" for k in range(1000) if partition_of(f"{name}.{k}", store.partitions) == 0)


def test_clicks_on_long_tail_items_are_counted_per_variant(store):
    state = open_state(store)
    u = lambda name: one_shard(store, name)  # noqa: E731
    # 20 items; the head is the top fifth (4 items, events.long_tail): "h" (10 behaviours), "g" (5),
    # then of the 18 tied at one behaviour the last two by id, "t" and "s".
    store.write([BehaviourEvent(event_id=f"pop-{i}-{j}", user_id=u(f"p{j}"), item_id=item, ts=1.0)
                 for i, item in enumerate([*"abcdefghijklmnopqrs", "t"]) for j in range(1 + 9 * (item == "h")
                                                                                     + 4 * (item == "g"))])
    store.write([imp(u("u1"), "h", "r1", "A"), imp(u("u1"), "z", "r1", "A"), imp(u("u2"), "g", "r2", "A"),
                 click(u("u1"), "h", "r1"), click(u("u1"), "z", "r1"), click(u("u2"), "g", "r2")])
    a = state.sums("exp1")["A"]
    assert a.clicks == 3 and a.tail_clicks == 1  # only "z" (never seen before) is in the long tail


def test_the_store_draws_the_long_tail_where_the_serving_lane_does(store):
    state = open_state(store)
    import numpy as np

    from dinrec.events.long_tail import long_tail_mask

    u = lambda name: one_shard(store, name)  # noqa: E731
    counts = [6, 5, 5, 3, 3, 2, 1, 1, 1, 1]  # i0..i9: the head is 2 items, i0 and (ties by id, last) i2
    store.write([BehaviourEvent(event_id=f"pop-{j}-{n}", user_id=u(f"p{n}"), item_id=f"i{j}", ts=1.0)
                 for j, c in enumerate(counts) for n in range(c)])
    clicked = ["i0", "i1", "i3"]
    store.write([e for j, item in enumerate(clicked) for e in (imp(u(f"u{j}"), item, f"r{j}", "A"),
                                                               click(u(f"u{j}"), item, f"r{j}"))])
    tail = long_tail_mask(np.array([0, *counts]))  # by item index: 0 is padding, i0 is index 1
    expected = sum(bool(tail[1 + int(item[1:])]) for item in clicked)
    assert expected == 2 and state.sums("exp1")["A"].tail_clicks == expected  # i1 and i3


@pytest.fixture(params=STORE_KINDS)
def open_catalog(request, unique, clock):
    """A store whose catalog admits an item on its first behaviour."""
    yield from online_store(request.param, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                            catalog_min_users=1)


def test_the_catalog_lists_each_item_once_with_its_first_category_from_a_cursor(open_catalog):
    store = open_catalog
    store.write([ev("u1", "a", 1.0, category_id="c1"), ev("u2", "b", 2.0, category_id="c2"),
                 imp("u1", "shown-only", "r1", "A")])  # an impression is no behaviour: not in the catalog
    first, cursor = store.catalog()
    assert sorted(first) == [("a", "c1"), ("b", "c2")]
    store.write([ev("u1", "a", 3.0, category_id="c9"), ev("u1", "d", 4.0, category_id="c4")])
    store.write([ev("u1", "d", 4.0, category_id="c4")])  # redelivered: nothing new
    page, cursor = store.catalog(cursor)
    assert page == [("d", "c4")]  # a keeps its first category and its place
    assert store.catalog(cursor) == ([], cursor)
    assert len(store.catalog(limit=1)[0]) == (1 if store.partitions == 1 else 2)  # the limit is per shard


def test_serving_lists_an_item_first_seen_in_two_shards_once(open_catalog):
    from dinrec.serving.catalog import Catalog

    store = open_catalog
    assert store.partitions == 1 or partition_of("u1", 4) != partition_of("u2", 4)
    catalog = Catalog()
    store.write([ev("u1", "x", 1.0, category_id="c1"), ev("u1", "y", 1.5, category_id="c1")])
    store.write([ev("u2", "x", 2.0, category_id="c1"), ev("u2", "z", 2.5, category_id="c2")])
    assert catalog.poll(store) == 3 and sorted(catalog.items) == [("x", "c1"), ("y", "c1"), ("z", "c2")]
    store.write([ev("u3", "x", 3.0, category_id="c1"), ev("u3", "w", 3.5, category_id="c3")])
    assert catalog.poll(store) == 1 and catalog.items[-1] == ("w", "c3")


def test_an_item_clients_name_joins_the_catalog_once_enough_users_took_it(admitting_store, clock):
    """Three users by default (``catalog_min_users``) within a popularity window (a user once in it): one
    client repeating a behaviour, or inventing ids, puts nothing in the catalog nor in popularity; a trusted
    feed admits at once."""
    store = admitting_store
    store.write([ev("bot", "odd", float(j), eid=f"b{j}", category_id="c1") for j in range(1000)])
    assert store.catalog()[0] == [] and store.popular(5) == []  # counted apart until admitted
    store.write([ev("u1", "odd", 1.0, category_id="c1"), ev("u1", "new", 1.0, category_id="c2")])
    assert store.catalog()[0] == []
    clock.now += 3600  # within the day: a third user
    store.write([ev("u3", "odd", 2000.0, category_id="c1")])
    assert store.applied_behaviours() == 1003
    one_shard = store.partitions == 1 or len({partition_of(u, 4) for u in ("bot", "u1", "u3")}) == 1
    assert store.popular(5) == ([("odd", 3.0)] if one_shard else [])  # per shard: bot and u1 may count apart
    listed, cursor = store.catalog()
    assert listed == ([("odd", "c1")] if one_shard else [])
    store.write([ev("u2", "odd", 3.0, category_id="c1"), ev("u2", "odd", 4.0, eid="again", category_id="c1")])
    if store.partitions == 1:
        assert store.popular(5) == [("odd", 4.0)]  # once admitted, every count goes on
    assert store.admit([("new", "c2"), ("feed", "c3"), ("odd", "c1")]) == (2 if listed else 3)
    page, _ = store.catalog(cursor)
    assert sorted(page) == sorted([("new", "c2"), ("feed", "c3")] + ([] if listed else [("odd", "c1")]))
    assert store.admit([("feed", "c9")]) == 0  # admitted already: its category stays


def test_what_invented_item_ids_make_the_store_hold_is_forgotten_after_the_window(admitting_store, clock):
    store = admitting_store
    store.write([ev(f"bot{j}", f"made-up-{j}", 1.0, category_id="c1") for j in range(50)])
    assert store.popular(100) == [] and store.catalog()[0] == []
    if store.backend == "memory":
        assert len(store._admitting) == 50
    else:
        pending = list(store.client.scan_iter(f"{store.prefix}:*:adm:*"))
        assert len(pending) == 50 and all(0 < store.client.ttl(k) <= 24 * 3600 for k in pending)
    clock.now += 24 * 3600 + 1
    store.write([ev("someone", "made-up-0", 2.0, category_id="c1")])  # a count after the window starts again
    if store.backend == "memory":
        assert list(store._admitting) == ["made-up-0"] and store._admitting["made-up-0"][0] == 1


def test_a_sharded_store_judges_the_long_tail_by_the_clicking_users_shard(store):
    if store.partitions == 1:
        pytest.skip("one shard: every click is judged by all the popularity (the tests above)")
    state = open_state(store)
    fans = [n for n in (f"p{k}" for k in range(200)) if partition_of(n, store.partitions) == 0][:10]
    stranger = next(n for n in (f"s{k}" for k in range(200)) if partition_of(n, store.partitions) == 1)
    store.write([BehaviourEvent(event_id=f"pop-{n}-{i}", user_id=n, item_id=i, ts=1.0)
                 for n in fans for i in ("hit", *(f"x{j}" for j in range(fans.index(n))))])
    assert store.popular(1) == [("hit", 10.0)]  # summed over the shards: the head of everything
    store.write([imp(stranger, "hit", "r1", "A"), click(stranger, "hit", "r1")])
    assert state.sums("exp1")["A"].tail_clicks == 1  # its shard has never seen "hit": tail there


def test_popular_is_the_exact_top_of_the_summed_shards(store):
    import random

    rng = random.Random(7)
    items = [f"i{j:03d}" for j in range(300)]  # more than a page (64) per shard: the threshold is reached in steps
    events = [BehaviourEvent(event_id=f"e{n}", user_id=f"u{rng.randrange(300)}",
                             item_id=items[min(int(rng.paretovariate(0.8)) - 1, 299)], ts=float(n))
              for n in range(4000)]
    store.write(events)
    counts: dict[str, float] = {}
    for _, item in {(e.user_id, e.item_id) for e in events}:  # a (user, item) counts once a window
        counts[item] = counts.get(item, 0.0) + 1
    want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert len(want) > 64
    for k in (1, 3, 10, 65, len(want), 1000):
        assert store.popular(k) == want[:k]


def test_the_embedded_store_forgets_attributions_after_the_window(clock):
    from dinrec.feature_store.online.memory import MemoryStore

    store = MemoryStore(dedup_window_s=3600, clock=clock)
    state = open_state(store)
    store.write([imp("u1", "a", "r1", "A"), imp("u1", "b", "r1", "A")])
    clock.now += 3601
    store.write([imp("u2", "c", "r2", "A")])  # a later write drops what expired, as Redis expires it
    assert set(store._att) == {("r2", "c")}  # memory stays bounded by the window's traffic
    store.write([click("u1", "a", "r1", eid="late"), click("u2", "c", "r2", eid="fresh")])
    assert state.unattributed()["orphan_clicks"] == 1 and state.sums("exp1")["A"].clicks == 1


@pytest.mark.redis
def test_a_redis_that_may_evict_the_stores_keys_is_refused_at_open_unless_allowed(own_redis, caplog):
    import redis

    from dinrec.feature_store.errors import StoreConfigError
    from dinrec.feature_store.online import open_store
    from dinrec.feature_store.settings import FeatureStoreSettings

    settings = FeatureStoreSettings(store="redis", redis_url=own_redis.url)
    open_store(settings).close()  # redis' default: noeviction
    redis.Redis.from_url(own_redis.url).config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(StoreConfigError, match="maxmemory-policy allkeys-lru.*DINREC_REDIS_ALLOW_EVICTION"):
        open_store(settings)
    with caplog.at_level("ERROR", logger="dinrec.feature_store.online"):
        open_store(settings.model_copy(update={"redis_allow_eviction": True})).close()
    (line,) = [r.getMessage() for r in caplog.records if "evicts keys" in r.getMessage()]
    assert "running on it" in line


@pytest.mark.parametrize("reply", [
    {"maxmemory-policy": "allkeys-lru"},  # a cluster of one primary: its reply alone
    {"10.0.0.1:6379": {"maxmemory-policy": "noeviction"}, "10.0.0.2:6379": {"maxmemory-policy": "allkeys-lru"}},
])
def test_a_cluster_that_may_evict_is_named_whatever_its_number_of_primaries(reply, monkeypatch):
    class Client:  # redis-py's cluster client: one reply per primary by node name, unless there is one
        def config_get(self, pattern, target_nodes=None):
            return reply

    store = RedisStore("redis://localhost:1", cluster=True)
    monkeypatch.setattr(store, "_r_client", Client())
    assert "maxmemory-policy allkeys-lru" in (store.eviction_problem() or "")


@pytest.fixture(params=STORE_KINDS)
def bounded_store(request, unique, clock):
    """A user's keys expire 2 h after its last write; at most 3 event ids per user in the dedup set."""
    yield from online_store(request.param, request, unique, history_cap=5, dedup_window_s=3600, clock=clock,
                            user_ttl_s=7200, seen_cap=3)


def test_what_one_user_id_makes_the_store_hold_is_bounded(bounded_store, clock):
    """Invented user ids must not fill the store: a user's keys expire after its last write, and its dedup
    set keeps at most ``seen_cap`` ids (the newest), while dedup of recent events still holds."""
    store = bounded_store
    store.write([ev("bot", f"i{j}", float(j), eid=f"b{j}") for j in range(8)])
    assert store.write([ev("bot", "i7", 7.0, eid="b7")]) == 0  # a recent id: still applied once
    if store.backend == "memory":
        assert list(store._seen["bot"]) == ["b5", "b6", "b7"] and list(store._counted["bot"]) == ["i5", "i6", "i7"]
        clock.now += 7200 + 1
        store.write([ev("someone", "i1", 1.0)])  # any write lets the embedded store expire the idle users
        assert store.history("bot", 10) == [] and "bot" not in store._seen and "bot" not in store._items
        assert "bot" not in store._counted
        assert [h.item_id for h in store.history("someone", 10)] == ["i1"]
    else:
        r = store.client
        keys = [k for k in store.client.scan_iter(f"{store.prefix}:*") if k.endswith(":bot")]
        assert sorted(k.split(":")[-2] for k in keys) == ["hist", "items", "pc", "seen"]
        assert r.zrange(next(k for k in keys if ":seen:" in k), 0, -1) == ["b5", "b6", "b7"]
        assert r.zrange(next(k for k in keys if ":pc:" in k), 0, -1) == ["i5", "i6", "i7"]  # the seen cap too
        assert 0 < r.ttl(next(k for k in keys if ":pc:" in k)) <= 24 * 3600  # the popularity window
        assert all(0 < r.ttl(k) <= 7200 for k in keys if ":hist:" in k or ":items:" in k)  # the user TTL
        assert 0 < r.ttl(next(k for k in keys if ":seen:" in k)) <= 3600  # the dedup window


def test_a_users_ab_state_expires_with_its_other_keys(bounded_store, clock):
    store = bounded_store
    store.write([imp("u1", "a", "r1", "A")])
    if store.backend == "memory":
        clock.now += 7200 + 1
        store.write([ev("someone", "i1", 1.0)])
        assert ("exp1", "u1") not in store._ab_user
    else:
        r = store.client
        keys = [k for k in r.scan_iter(f"{store.prefix}:*") if k.endswith((":ab:exp1:u:u1", ":ab:ue:u1"))]
        assert len(keys) == 2 and all(0 < r.ttl(k) <= 7200 for k in keys)


def test_experiment_counts_are_kept_per_segment_of_user_and_add_up(store):
    """Each user's counts land in their segment by the behaviours they had before their first exposure (none:
    new; 1-9: light; 10+: heavy — the history cap, 5 here, keeps this store's users below heavy)."""
    state = open_state(store)
    store.write([ev("old", f"h{j}", float(j)) for j in range(3)])  # 3 behaviours, then exposed
    store.write([imp("old", "x", "r1", "A"), imp("fresh", "x", "r2", "A"), imp("fresh", "y", "r2", "A"),
                 click("fresh", "y", "r2"), conversion("old", "z", value=5.0)])
    segments = state.segments("exp1")
    assert set(segments) == {"new", "light"}
    new, light = segments["new"]["A"], segments["light"]["A"]
    assert (new.users, new.impressions, new.clicks, new.buys, new.pre) == (1, 2, 1, 0, 0)
    assert (light.users, light.impressions, light.clicks, light.buys, light.pre, light.pre_buys) == (1, 1, 0, 1, 3, 3)
    total = state.sums("exp1")["A"]
    assert (total.users, total.impressions, total.clicks, total.buys, total.value) == (2, 3, 1, 1, 5.0)


def test_what_each_arm_served_adds_up_across_batches_and_replicas(store):
    """The served-list tallies (experiments.served) of two batches — as two replicas' impression logs send
    them — add up in the shared state; the distinct items are a set's (Redis: a HyperLogLog's estimate)."""
    from dinrec.experiments.served import Tally

    state = open_state(store)
    for batch in range(2):
        t = Tally()
        for j in range(50):
            t.add([f"i{(batch * 50 + j) % 80}", "common"], degraded=j % 10 == 0, latency_ms=3.0 + j, tail_items=1)
        state.add_served("exp1", {"A": t})
    served = state.served("exp1", ["A", "B"])
    counts, distinct = served["A"]
    assert (counts["lists"], counts["degraded"], counts["items"], counts["tail_items"]) == (100, 10, 200, 100)
    assert counts["lat_le_5"] + counts["lat_le_10"] + counts["lat_le_25"] + counts["lat_le_50"] + \
        counts["lat_le_100"] == 100
    assert distinct == pytest.approx(81, abs=2)  # 80 items and "common"
    assert served["B"] == ({}, 0)
