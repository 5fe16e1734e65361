"""What a served list holds: nothing the user already took (the seen-item policy), and ``k`` items on
every path — ranked, cold user, store down, deadline passed, the popularity variant."""

from __future__ import annotations

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import online_store
from tests.serving.conftest import live_server


@pytest.fixture(params=["memory", "redis"])
def store(request, unique):
    yield from online_store(request.param, request, unique, history_cap=5, interacted_cap=1000)


def _serve(tiny_run, store, **settings):
    s = ServingSettings(bundle_dir=tiny_run[2], max_k=100, events_sink="store", **settings)
    return live_server(s, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True)


def _taken(tiny_run, n: int) -> list[BehaviourEvent]:
    """``n`` behaviours of one user on distinct items the model knows (more than the history keeps)."""
    items = tiny_run[1].vocab.items[1:n + 1]
    cats = {i: tiny_run[1].vocab.categories[c] for i, c in
            zip(tiny_run[1].vocab.items, tiny_run[1].vocab.item_category.tolist(), strict=True)}
    return [BehaviourEvent(event_id=f"t{j}", user_id="taker", item_id=item, category_id=cats[item], ts=1000.0 + j)
            for j, item in enumerate(items)]


def test_seen_policy_all_keeps_out_every_item_taken_beyond_the_history(tiny_run, store):
    events = _taken(tiny_run, 40)
    store.write(events)
    assert len(store.history("taker", 100)) == 5  # the history forgot 35 of them; the seen set did not
    taken = {e.item_id for e in events}
    with _serve(tiny_run, store) as client:
        body = client.get("/recommend", params={"user_id": "taker", "k": 100}).json()
    assert body["strategy"] == "din" and len(body["items"]) == 100
    assert not taken & {x["item_id"] for x in body["items"]}


def test_seen_policy_recent_and_none(tiny_run, store):
    events = _taken(tiny_run, 40)
    store.write(events)
    recent = {e.item_id for e in events[-5:]}
    n_items = len(tiny_run[1].vocab.items) - 1
    with _serve(tiny_run, store, seen_policy="recent") as client:
        served = {x["item_id"] for x in client.get("/recommend", params={"user_id": "taker", "k": 100}).json()["items"]}
    assert not recent & served
    assert {e.item_id for e in events[:-5]} & served  # older ones may come back: only the window is excluded
    with _serve(tiny_run, store, seen_policy="none", recall_candidates=n_items) as client:
        served = {x["item_id"] for x in client.get("/recommend", params={"user_id": "taker", "k": 100}).json()["items"]}
    assert recent & served  # repeat-purchase catalogs: what was taken may be offered again


def test_every_path_fills_the_list_to_k(tiny_run):
    """A store that has seen a single item (admitted on its first user): the cold user's list goes on with
    the bundle's popularity;
    a known user whose recall finds too few gets popular items after the ranked ones; the store down,
    and the deadline passed answer ``k`` too (the popularity variant takes the cold user's path)."""
    store = MemoryStore(history_cap=50, catalog_min_users=1)
    vocab = tiny_run[1].vocab
    store.write([BehaviourEvent(event_id="only", user_id="someone", item_id=vocab.items[1],
                                category_id=vocab.categories[int(vocab.item_category[1])], ts=1.0)])
    with _serve(tiny_run, store, recall_candidates=3) as client:
        cold = client.get("/recommend", params={"user_id": "new", "k": 10}).json()
        assert cold["strategy"] == "popular" and len(cold["items"]) == 10
        assert cold["items"][0]["item_id"] == vocab.items[1]  # live popularity first, the bundle's after it
        known = client.get("/recommend", params={"user_id": "someone", "k": 10}).json()
        assert known["strategy"] == "din" and len(known["items"]) == 10
        assert vocab.items[1] not in {x["item_id"] for x in known["items"]}
        scores = [x["score"] for x in known["items"]]
        assert scores == sorted(scores, reverse=True)
        state = client.service_state()

        def down(*_a, **_k):
            raise StoreUnavailable("test: the store is down")

        state.store.history_and_interacted = down
        degraded = client.get("/recommend", params={"user_id": "someone", "k": 10}).json()
        assert degraded["degraded"] and "feature_store" in degraded["degraded_reasons"]
        assert len(degraded["items"]) == 10
    with _serve(tiny_run, store, request_deadline_ms=1) as client:
        late = client.get("/recommend", params={"user_id": "someone", "k": 10}).json()
        assert "deadline" in late["degraded_reasons"] and len(late["items"]) == 10
