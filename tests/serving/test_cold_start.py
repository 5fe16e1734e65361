"""A brand-new item — ingested after the model was trained — is recalled for users whose history is
in its category, through a running service that learns of it from the store's catalog."""

from __future__ import annotations

from collections import Counter

import torch

from dinrec.events.features import HistoryItem
from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import wait_until
from tests.serving.conftest import live_server


def test_a_new_item_is_recalled_for_its_categorys_fans_and_scored(tiny_run):
    data = tiny_run[0]
    store = MemoryStore()
    store.write(list(data.events()))
    by_cat = Counter(data.category_id.tolist())
    fans_cat, other_cat = [c for c, _ in by_cat.most_common(2)]
    fan_items = [i for i, c in dict(zip(data.item_id.tolist(), data.category_id.tolist(), strict=True)).items()
                 if c == fans_cat][:12]
    store.write([BehaviourEvent(event_id=f"fan-{j}", user_id="fan", item_id=item, category_id=fans_cat,
                                ts=1.6e9 + j) for j, item in enumerate(fan_items)])
    settings = ServingSettings(bundle_dir=tiny_run[2], events_sink="store", catalog_poll_s=0.1,
                               score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        rec = c.service_state().recommender
        rec.covisit_candidates = 0  # what is inspected here: the towers' recall and the lanes beside it
        assert not rec.knows("brand-new") and rec.cold is None
        # Two new items arrive after training, each clicked by three others (the catalog's admission).
        r = c.post("/events", json={"events": [
            {"event_id": f"n{j}-{n}", "user_id": f"early-{n}", "item_id": item, "category_id": cat,
             "event_type": "click", "ts": 1.65e9 + j} for n in range(3)
            for j, (item, cat) in enumerate([("brand-new", fans_cat), ("other-new", other_cat)])]})
        assert r.status_code == 202, r.text
        wait_until(lambda: rec.cold is not None and rec.cold.size == 2, timeout_s=10,
                   what="the catalog poll to give the model both new items")
        history = store.history("fan", 50)
        # By its category, for its fans: the new item of the fan's category in the better half of every unseen
        # item the fan could be recalled, the other category's new one in the worse half (the order within
        # each half is the towers' luck on this tiny world: 38th and 172nd of 188 when measured).
        ranked = rec.recall_items(history, 250)
        assert ranked.index("brand-new") < len(ranked) // 2 < ranked.index("other-new")
        recalled = rec.recall_items(history, 20)
        assert not set(fan_items) & set(ranked)  # seen items never come back
        rec.fresh_candidates = 2  # the freshness lane: new items join every recall
        assert {"brand-new", "other-new"} <= set(rec.recall_items(history, 20))
        rec.fresh_candidates = 0
        popular = [i for i, _ in rec.bundle.popularity if i not in set(fan_items)][:3]
        assert not set(popular) <= set(recalled)
        rec.popular_candidates = 3  # the popularity lane: the most popular unseen items join too
        with_popular = rec.recall_items(history, 20)
        assert set(popular) <= set(with_popular) and with_popular[:20] == recalled and len(with_popular) <= 23
        rec.popular_candidates = 0
        early = [HistoryItem(1.65e9, "n0-0", "brand-new", fans_cat)]
        assert "brand-new" not in rec.recall_items(history + early, 250)  # once seen, excluded too
        # DIN scores the new item (as an unknown item of its category) like any other: it is in the ranked
        # list of every candidate, with a probability. (Without the blend, which weighs in co-visitation
        # and popularity, of which a brand-new item has none.)
        blend, rec.blend = rec.blend, None
        body = c.get("/recommend", params={"user_id": "fan", "k": 50}).json()
        assert body["strategy"] == "din" and len(body["items"]) == 50
        ranked = rec.rank(store.history("fan", 50), 250, lambda n: [])
        scored = {x.item_id: x for x in ranked.items}
        assert ranked.strategy == "din" and "brand-new" in scored and scored["brand-new"].category_id == fans_cat
        assert 0 < scored["brand-new"].score < 1
        rec.blend = blend


def test_new_items_are_appended_to_the_lane_and_a_request_keeps_the_version_it_read(tiny_run):
    from dinrec.serving.models import load_recommender

    data, _, bundle_dir = tiny_run[0], tiny_run[1], tiny_run[2]
    rec = load_recommender(ServingSettings(bundle_dir=bundle_dir, score_precision="fp32"), bundle_dir)
    cats = [c for c, _ in Counter(data.category_id.tolist()).most_common(3)]
    assert rec.set_cold_items([("new-0", cats[0]), ("new-1", cats[1]), (str(data.item_id[0]), cats[0]),
                               ("no-such-category", "never-seen-category")]) == 2  # known and unplaceable skipped
    held = rec.cold  # what a request in flight reads
    assert held is not None and held.size == 2
    assert rec.set_cold_items([("new-0", cats[0]), ("new-1", cats[1]), ("new-2", cats[2])]) == 1  # only the new one
    now = rec.cold
    assert now is not None and now.size == 3 and held.size == 2
    assert held.id_of("new-2") is None and now.id_of("new-2") == now.base + 2
    # Appended in place: the lane's and the scorer's rows are the same storage in both versions.
    assert now.vectors.rows.data_ptr() == held.vectors.rows.data_ptr()
    same = {v.scorer.item_vectors.data_ptr() for v in (now, held)} | {rec.scorer.item_vectors.data_ptr()}
    assert len(same) == 1
    query = rec.recall.cold_item_vectors(torch.tensor([1]))
    assert query is not None  # the tiny model has towers
    found = held.search(query, 5, set())[0].tolist()
    assert sorted(found) == [-1, -1, -1, held.base, held.base + 1]  # the held version finds its two, not the third
    # Extending the older version forks its lists: the newer version keeps its third item, the fork has its own.
    fork = held.with_items([("other", cats[0])], torch.tensor([1]),
                           torch.from_numpy(rec.recall.cold_item_vectors(torch.tensor([1]))))
    assert fork.size == 3 and fork.id_of("other") == fork.base + 2 and fork.id_of("new-2") is None
    assert now.id_of("other") is None and now.id_of("new-2") == now.base + 2 and now.names[2] == "new-2"
    history = [HistoryItem(1.6e9 + j, f"h{j}", str(i), str(c)) for j, (i, c) in
               enumerate(zip(data.item_id[:10].tolist(), data.category_id[:10].tolist(), strict=True))]
    assert "new-2" in rec.recall_items(history, 10_000)
