"""What clients name is not trusted as the catalog or as popularity: item ids a client invents stay out
of every list and out of the serving model's memory, one user repeating a behaviour counts once, and the
shop's own feed (POST /admin/catalog) admits its new items at once."""

from __future__ import annotations

from collections import Counter

from dinrec.events.features import HistoryItem
from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import wait_until
from tests.serving.conftest import live_server


def test_item_ids_clients_invent_reach_no_list_and_a_trusted_feed_admits_at_once(tiny_run):
    data = tiny_run[0]
    store = MemoryStore()
    store.write(list(data.events()))
    cat = Counter(data.category_id.tolist()).most_common(1)[0][0]
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", catalog_poll_s=0.1)
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        rec = c.service_state().recommender
        catalog = c.service_state().catalog
        before = store.applied_behaviours()
        invented = [f"bogus-{j}" for j in range(300)]  # each by its own invented user, in a known category
        r = c.post("/events", json={"events": [{"event_id": f"x{j}", "user_id": f"bot-{j}", "item_id": item,
                                                "category_id": cat, "event_type": "buy", "ts": 1.7e9}
                                               for j, item in enumerate(invented)]})
        assert r.status_code == 202, r.text
        wait_until(lambda: store.applied_behaviours() == before + len(invented), what="the bots' events applied")
        polls = catalog.polls
        wait_until(lambda: catalog.polls >= polls + 2, what="two catalog polls after them")
        assert rec.cold is None  # nothing for the model to hold
        for user in ("new-a", "new-b", "bot-1"):
            listed = {x["item_id"] for x in c.get("/recommend", params={"user_id": user, "k": 50}).json()["items"]}
            assert not listed & set(invented), user
        # The shop's feed: a new item is recallable from the next poll, before anyone took it.
        feed = {"items": [{"item_id": "spring-coat", "category_id": cat}, {"item_id": invented[0], "category_id": cat}]}
        assert c.post("/admin/catalog", json=feed, headers={"authorization": ""}).status_code == 401
        r = c.post("/admin/catalog", json=feed)
        assert r.status_code == 200 and r.json() == {"admitted": 2, "received": 2}
        assert c.post("/admin/catalog", json=feed).json()["admitted"] == 0  # once
        wait_until(lambda: rec.cold is not None and rec.cold.size == 2, what="the fed items in the cold lane")
        assert c.post("/admin/catalog", json={"items": [{"item_id": "a\x01b", "category_id": cat}]}).status_code == 422


def test_one_user_repeating_a_buy_does_not_make_an_item_popular(tiny_run):
    data = tiny_run[0]
    store = MemoryStore()
    store.write(list(data.events()))
    counts = Counter(data.item_id.tolist())
    obscure, cat = next((i, c) for i, c in zip(data.item_id.tolist(), data.category_id.tolist(), strict=True)
                        if counts[i] == 1)
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store")
    # As the operator: past the per-user quota of /events (tests/serving/test_quotas.py), to reach the store's rule.
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        before = store.applied_behaviours()
        for n in range(5):
            r = c.post("/events", json={"events": [
                {"event_id": f"b{n}-{j}", "user_id": "eager", "item_id": obscure, "category_id": cat,
                 "event_type": "buy", "ts": 1.7e9 + j} for j in range(1000)]})
            assert r.status_code == 202, r.text
        wait_until(lambda: store.applied_behaviours() == before + 5000, what="the 5,000 buys applied")
        # its one buyer in the log, and this user once: 2, below the 3 that admit it to popularity at all
        assert store._admitting[obscure][0] == 2 and obscure not in dict(store.popular(10**6))
        listed = [x["item_id"] for x in c.get("/recommend", params={"user_id": "brand-new", "k": 10}).json()["items"]]
        assert obscure not in listed


def test_the_cold_lane_keeps_the_newest_items_of_each_category_and_is_rebuilt_when_they_change(tiny_run):
    """Whatever the catalog gains, what a model holds is at most ``per_category`` items of each category it
    knows: the oldest go, and the lane is built again without them (a request holding the old one keeps it)."""
    from dinrec.serving.catalog import Catalog
    from dinrec.serving.models import load_recommender

    data, bundle_dir = tiny_run[0], tiny_run[2]
    a, b = [c for c, _ in Counter(data.category_id.tolist()).most_common(2)]
    rec = load_recommender(ServingSettings(bundle_dir=bundle_dir, score_precision="fp32"), bundle_dir)
    store = MemoryStore(catalog_min_users=1)
    catalog = Catalog(known=rec.knows, apply=rec.set_cold_items, per_category=2)
    store.write([BehaviourEvent(event_id=f"e{j}", user_id="u", item_id=item, category_id=cat, ts=float(j))
                 for j, (item, cat) in enumerate([("a1", a), ("a2", a), ("b1", b)])])
    assert catalog.poll(store) == 3 and rec.cold is not None and rec.cold.names[:rec.cold.size] == ["a1", "a2", "b1"]
    held = rec.cold
    store.write([BehaviourEvent(event_id=f"f{j}", user_id="u", item_id=item, category_id=a, ts=10.0 + j)
                 for j, item in enumerate(["a3", "a4", "a5"])])
    assert catalog.poll(store) == 3 and catalog.items == [("b1", b), ("a4", a), ("a5", a)]
    assert rec.cold.names[:rec.cold.size] == ["b1", "a4", "a5"] and rec.cold.id_of("a1") is None
    assert held.size == 3 and held.id_of("a1") == held.base  # what a request in flight read is unchanged
    assert rec.cold.vectors.rows.data_ptr() != held.vectors.rows.data_ptr()  # a new lane, not appended to
    history = [HistoryItem(1.6e9, "h", str(data.item_id[0]), str(data.category_id[0]))]
    recalled = set(rec.recall_items(history, 10_000))
    assert {"b1", "a4", "a5"} <= recalled and not {"a1", "a2", "a3"} & recalled
