"""Business rules after DIN (caps, blocklists, shown items) and explanations, through HTTP."""

from __future__ import annotations

import pytest
import torch

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.models.rerank import Reranker
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN
from tests.serving.conftest import live_server

CANDIDATES = [("a", "x", 0.9), ("b", "x", 0.8), ("c", "y", 0.7), ("d", "x", 0.6), ("e", "z", 0.5), ("f", "y", 0.4)]


def test_category_cap_takes_the_best_list_under_it():
    chosen = Reranker(max_per_category=1).select(CANDIDATES, 5)
    assert [CANDIDATES[i][0] for i, _ in chosen] == ["a", "c", "e"]  # one per category, best first
    chosen = Reranker(max_per_category=2).select(CANDIDATES, 4)
    assert [CANDIDATES[i][0] for i, _ in chosen] == ["a", "b", "c", "e"]


def test_the_long_tail_lane_keeps_its_share_of_every_prefix_and_gives_slots_back_when_it_runs_dry():
    tail = [False, False, False, False, True, True]  # e and f are long-tail items
    lane = Reranker(tail_share=0.5)
    chosen = lane.select(CANDIDATES, 4, tail=tail)
    # Half of every prefix: a tail item is due at positions 2 and 4, the best head item elsewhere.
    assert [CANDIDATES[i][0] for i, _ in chosen] == ["a", "e", "b", "f"]
    assert [CANDIDATES[i][0] for i, _ in Reranker().select(CANDIDATES, 4, tail=tail)] == ["a", "b", "c", "d"]
    few_tail = [False, False, False, False, True, False]
    assert [CANDIDATES[i][0] for i, _ in lane.select(CANDIDATES, 4, tail=few_tail)] == ["a", "e", "b", "c"]
    assert [CANDIDATES[i][0] for i, _ in lane.select(CANDIDATES, 4, tail=tail, tail_share=0.0)] == \
        ["a", "b", "c", "d"]  # a variant's override turns the lane off


@pytest.mark.parametrize("share", [0.0, 0.2, 0.34, 0.5, 1.0])
def test_a_shorter_list_is_the_first_part_of_a_longer_one(share):
    tail = [False, True, False, True, True, False]
    for rr in (Reranker(tail_share=share), Reranker(tail_share=share, max_per_category=1)):
        longest = rr.select(CANDIDATES, len(CANDIDATES), tail=tail)
        for k in range(1, len(CANDIDATES) + 1):
            shorter = rr.select(CANDIDATES, k, tail=tail)
            assert shorter == longest[:k]
            if rr.max_per_category is None:  # (a cap can leave no tail item allowed)
                assert sum(tail[i] for i, _ in shorter) >= min(int(k * share + 1e-9), sum(tail))  # its share


def test_blocklists_remove_and_shown_items_go_down():
    rr = Reranker(blocked_items=frozenset({"c"}), blocked_categories=frozenset({"z"}), shown_penalty=0.5)
    chosen = rr.select(CANDIDATES, 10, shown={"a"})
    assert [CANDIDATES[i][0] for i, _ in chosen] == ["b", "d", "a", "f"]  # a: 0.9 × 0.5 = 0.45
    assert dict((CANDIDATES[i][0], s) for i, s in chosen)["a"] == pytest.approx(0.45)


@pytest.fixture
def served(tiny_run):
    data = tiny_run[0]
    store = MemoryStore()
    store.write(list(data.events()))
    popular = [i for i, _ in store.popular(3)]
    blocked_cat = data.category_id[0]
    settings = ServingSettings(bundle_dir=tiny_run[2], max_k=50, max_per_category=2, score_precision="fp32",
                               admin_token=ADMIN_TOKEN,
                               blocked_items=frozenset(popular[:1]), blocked_categories=frozenset({blocked_cat}))
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as c:
        yield c, data, store, popular[0], blocked_cat


def test_caps_and_blocklists_hold_in_every_list(served):
    c, data, _, blocked_item, blocked_cat = served
    users = sorted(set(data.user_id.tolist()))[:40] + ["nobody-at-all"]
    for user in users:
        body = c.get("/recommend", params={"user_id": user, "k": 12}).json()
        cats = [x["category_id"] for x in body["items"]]
        assert body["items"] and max(cats.count(x) for x in cats) <= 2, (user, cats)
        assert blocked_item not in {x["item_id"] for x in body["items"]}
        assert blocked_cat not in cats


def test_a_shown_item_is_pushed_down(served):
    c, data, _, _, _ = served
    user = data.user_id[3]
    first = c.get("/recommend", params={"user_id": user, "k": 10}).json()["items"]
    top = first[0]["item_id"]
    again = c.post("/recommend", json={"user_id": user, "k": 10, "shown": [top]}).json()["items"]
    assert again[0]["item_id"] != top
    moved = [x for x in again if x["item_id"] == top]
    # Through HTTP the item may leave the list (the category cap); the penalty itself is held exactly below.
    assert not moved or moved[0]["score"] == pytest.approx(first[0]["score"] * 0.5, rel=1e-4)


def test_the_shown_penalty_multiplies_the_score_and_reorders():
    from dinrec.models.rerank import Reranker

    candidates = [("a", "x", 0.9), ("b", "y", 0.8), ("c", "z", 0.3)]
    assert Reranker(shown_penalty=0.5).select(candidates, 3, shown={"a"}) == [(1, 0.8), (0, 0.45), (2, 0.3)]
    assert Reranker().select(candidates, 3) == [(0, 0.9), (1, 0.8), (2, 0.3)]


def test_the_category_cap_holds_across_the_popularity_fill(served):
    """A long list runs out of capped candidates and is filled from popularity: the fill counts the
    categories already listed (it used to start its own count, and a k=50 list held 4 of one)."""
    c, data, _, _, _ = served
    for user in sorted(set(data.user_id.tolist()))[:20]:
        cats = [x["category_id"] for x in c.get("/recommend", params={"user_id": user, "k": 50}).json()["items"]]
        assert cats and max(cats.count(x) for x in cats) <= 2, (user, cats)
    from dinrec.models.rerank import Reranker

    assert Reranker(max_per_category=2).select([("a", "x", 0.9), ("b", "y", 0.8)], 2, listed=["x", "x"]) == [(1, 0.8)]


def test_explanations_are_the_models_attention_weights(served, tiny_run):
    """``because`` names the behaviours with the largest weights in DIN's activation unit for that item —
    recomputed here with PyTorch's ops (the service may use the fused unit) from the same inputs: the
    user's known behaviours with their times, co-visitation and counts (models.context)."""
    from dinrec.models.bundle import load_bundle
    from dinrec.models.context import served_context

    c, data, store, _, _ = served
    user = data.user_id[7]
    denied = c.get("/recommend", params={"user_id": user, "k": 5, "explain": "true"})
    assert denied.status_code == 403 and denied.json()["error"] == "forbidden"  # it names the user's behaviours
    body = c.get("/recommend", params={"user_id": user, "k": 5, "explain": "true"}, headers=ADMIN_HEADERS).json()
    bundle = load_bundle(tiny_run[2])
    model, vocab = bundle.model.eval(), bundle.vocab
    assert model.list_unit is None  # this copy: PyTorch's ops
    item_idx, cat_idx = vocab.item_index(), {x: i for i, x in enumerate(vocab.categories)}
    window = store.history(user, c.service_state().recommender.seq_len)  # what the service reads
    assert len(window) >= 10
    history = [h for h in window if h.item_id in item_idx]
    h_items = torch.tensor([[item_idx[h.item_id] for h in history]])
    h_cats = torch.tensor([[cat_idx[h.category_id] for h in history]])
    ts = torch.tensor([[h.ts for h in history]], dtype=torch.float64)
    pairs, counts = bundle.context_sources()
    for item in body["items"]:
        assert 1 <= len(item["because"]) <= 3
        target = torch.tensor([[item_idx[item["item_id"]]]])
        target_cat = torch.tensor([[vocab.item_category[int(target.item())]]])
        with torch.inference_mode():
            context = (served_context(model.cfg, pairs, counts, h_items, h_cats, ts, target, target_cat)
                       if model.cfg.has_context else None)
            _, weights = model.lists_from(model.embed(h_items, h_cats), h_items != 0, model.embed(target, target_cat),
                                          context)
            weights = weights[0, 0]  # (L,)
        order = torch.argsort(weights, descending=True, stable=True)[:len(item["because"])]
        assert [b["item_id"] for b in item["because"]] == [history[i].item_id for i in order.tolist()]
        assert [b["weight"] for b in item["because"]] == pytest.approx(weights[order].tolist(), abs=1e-4)
    plain = c.get("/recommend", params={"user_id": user, "k": 5}).json()
    assert all(x["because"] is None for x in plain["items"])
