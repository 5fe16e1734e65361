"""A/B through the API: users get sticky variants named in every answer, each served list is logged as
impressions, clicks sent back with the request id are attributed, and the results endpoint adds up."""

from __future__ import annotations

import json
import time

import pytest

from dinrec.experiments import open_state
from dinrec.experiments.running import Experiments
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.models import ModelManager
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import wait_until
from tests.serving.conftest import live_server

EXPERIMENT = {"name": "baseline", "status": "running", "seed": "s1",
              "variants": [{"name": "din"}, {"name": "popular", "overrides": {"strategy": "popular"}}]}


def test_variants_impressions_clicks_and_results_add_up(tiny_run, tmp_path):
    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [EXPERIMENT]}))
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    users = sorted(set(tiny_run[0].user_id.tolist()))[:40]
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store",
                               score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        answers = {u: c.get("/recommend", params={"user_id": u, "k": 4}).json() for u in users}
        assert {a["experiment"] for a in answers.values()} == {"baseline"}
        by_variant = {v: [u for u, a in answers.items() if a["variant"] == v] for v in ("din", "popular")}
        assert by_variant["din"] and by_variant["popular"]  # 40 users, 50/50: both arms get some
        assert all(answers[u]["strategy"] == "popular" for u in by_variant["popular"])
        assert all(answers[u]["strategy"] == "din" for u in by_variant["din"] if answers[u]["history_len"])
        again = c.get("/recommend", params={"user_id": users[0], "k": 4}).json()
        assert again["variant"] == answers[users[0]]["variant"]  # sticky

        first = {u: len(store.history(u, 50)) for u in users}  # each user's history when first served
        shown = sum(len(a["items"]) for a in answers.values()) + len(again["items"])
        wait_until(lambda: sum(s.impressions for s in open_state(store).sums("baseline").values()) == shown,
                   what="every shown item logged as an impression")

        clicks = [{"event_id": f"click-{u}", "user_id": u, "item_id": answers[u]["items"][0]["item_id"],
                   "event_type": "click", "ts": 1.7e9, "request_id": answers[u]["request_id"]}
                  for u in users[:10]]
        clicks.append({"event_id": "stray", "user_id": users[0], "item_id": "nothing-shown", "event_type": "click",
                       "ts": 1.7e9, "request_id": answers[users[0]]["request_id"]})
        assert c.post("/events", json={"events": clicks}).status_code == 202
        assert c.post("/events", json={"events": clicks}).status_code == 202  # a retry counts nothing twice

        r = c.get("/experiments/baseline/results").json()
        got = r["results"]["variants"]
        assert {v: got[v]["users"] for v in got} == {v: len(us) for v, us in by_variant.items()}
        assert sum(got[v]["clicks"] for v in got) == 10
        assert got["din"]["clicks"] == sum(1 for u in users[:10] if u in by_variant["din"])
        assert r["unattributed"]["orphan_clicks"] == 1
        assert [x["variant"] for x in r["results"]["comparisons"]] == ["popular"]
        assert 0 <= r["results"]["srm"]["p_value"] <= 1
        # What each arm served, as a set (every request's list; the tally lands after its impressions).
        requests = {v: len(us) + (v == again["variant"]) for v, us in by_variant.items()}
        wait_until(lambda: {v: x["lists"] for v, x in c.get("/experiments/baseline/results").json()["results"][
            "served"].items()} == requests, what="every served list tallied")
        served = c.get("/experiments/baseline/results").json()["results"]["served"]
        for v, x in served.items():
            shown_v = sum(len(answers[u]["items"]) for u in by_variant[v]) + (len(again["items"]) if v ==
                                                                             again["variant"] else 0)
            distinct = {i["item_id"] for u in by_variant[v] for i in answers[u]["items"]}
            assert x["distinct_items"] == len(distinct) and 0 < x["coverage"] < 1
            assert x["degraded_rate"] == 0 and x["latency_p95_ms"] > 0 and 0 <= x["long_tail_share"] <= 1
            assert round(x["long_tail_share"] * shown_v) == pytest.approx(x["long_tail_share"] * shown_v, abs=1e-6)
        # The breakdown: every user in the segment of the history they had when first served (the store's).
        breakdown = r["results"]["breakdown"]
        assert breakdown["exploratory"] and [g["segment"] for g in breakdown["segments"]] == ["new", "light", "heavy"]
        for v in got:
            assert sum(g["users"][v] for g in breakdown["segments"]) == got[v]["users"]
        heavy = [g for g in breakdown["segments"] if g["segment"] == "heavy"][0]
        assert sum(heavy["users"].values()) == sum(1 for n in first.values() if n >= 10) > 0
        assert set(heavy["metrics"]) == {"ctr", "conversions_per_user", "value_per_user"}
        assert c.get("/experiments/nope/results").status_code == 404
        assert [e["name"] for e in c.get("/experiments").json()["experiments"]] == ["baseline"]
        listed = c.get("/experiments").json()["experiments"][0]
        assert "seed" not in listed and "seed" not in c.get("/experiments/baseline/results").json()["experiment"]
        # Power: the users the sequential test still needs to find the experiment's MDE (5 % by default).
        power = r["results"]["power"]
        assert power["mde"] == 0.05 and power["target_power"] == 0.8 and power["sequential"]
        popular = power["variants"]["popular"]
        assert popular["decided"] == (r["results"]["comparisons"][0]["sequential"] != "inconclusive")
        if r["results"]["comparisons"][0]["lift_se"] is not None and not popular["decided"]:
            assert popular["users_still_needed"] > len(users)  # far more than these few, for a 5 % lift

        # The stored snapshots, a page at a time (within the last day, so all kept; before the guardrail's).
        base = time.time() - 1000
        for k in range(1, 13):
            open_state(store).snapshot("baseline", -k, {"t": base + k, "variants": {}})
        pages, since = [], base
        while since is not None:
            page = c.get("/experiments/baseline/results", params={"since": since, "limit": 5}).json()
            pages.append([s["t"] - base for s in page["snapshots"]])
            since = page["next_since"]
        assert pages[0] == [1, 2, 3, 4, 5] and pages[1] == [6, 7, 8, 9, 10] and pages[2][:2] == [11, 12]
        assert "snapshots" not in r and r["timeline_resolution"] in ("snapshot", "hour", "day")
        assert c.get("/experiments/baseline/results", params={"limit": 0}).status_code == 422

        # The planning calculator: day by day, and the first day the effect is found with 80 % power.
        planned = c.get("/experiments/plan", params={"mean": 0.05, "sd": 0.08, "users_per_day": 2000,
                                                     "effect": 0.05, "days": 30, "sequential": "false"}).json()
        from dinrec.experiments.power import plan

        assert planned == plan(0.05, 0.08**2, 0.05, 2000, days=30)
        assert planned["days_needed"] is not None and len(planned["days"]) == 30
        for bad in ({"sd": -1}, {"variations": 1}, {"alpha": 0.7}, {"days": 10_000}, {"sequential": "maybe"},
                    {"mean": 5e-324, "sd": 5e-324, "users_per_day": 5e-324}):  # schemathesis' find: was a 500
            params = {"mean": 0.05, "sd": 0.08, "users_per_day": 2000, **bad}
            assert c.get("/experiments/plan", params=params).status_code == 422, bad


def test_variants_naming_models_need_a_registry(tiny_run, tmp_path):
    path = tmp_path / "experiments.json"
    exp = {**EXPERIMENT, "variants": [{"name": "a"}, {"name": "b", "model": "challenger"}]}
    path.write_text(json.dumps({"experiments": [exp]}))
    assert Experiments.load(path).models() == {"challenger"}
    manager = ModelManager(ServingSettings(bundle_dir=tiny_run[2], score_precision="fp32"), on_swap=lambda rec: None)
    with pytest.raises(ValueError, match="name models \\['challenger'\\] but no registry"):
        manager.load_variants(Experiments.load(path).models())  # the lifespan's call: the service does not start


RESULTS_TOKEN = "5e8a1c3f9b7d2e4a6c0f8b1d3e5a7c9f"


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_the_results_ask_for_their_read_token_beyond_loopback(tiny_run, tmp_path, host):
    """Listening beyond loopback with DINREC_RESULTS_TOKEN, the experiment list and results answer only with
    that token (or the admin token); bound to loopback nobody else reaches them, so none is asked for. The
    page itself and the power calculator hold no results: open."""
    from pydantic import SecretStr

    from tests.conftest import ADMIN_HEADERS

    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [EXPERIMENT]}))
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, events_sink="store", host=host,
                               anonymous_users=True, results_token=SecretStr(RESULTS_TOKEN), score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        routes = ("/experiments", "/experiments/baseline/results")
        for route in routes:
            plain = c.get(route)
            if host == "127.0.0.1":
                assert plain.status_code == 200
                continue
            assert plain.status_code == 401 and plain.headers["www-authenticate"] == "Bearer"
            assert "DINREC_RESULTS_TOKEN" in plain.json()["message"]
            assert c.get(route, headers={"authorization": "Bearer " + "0" * 32}).status_code == 401
            assert c.get(route, headers={"authorization": f"Bearer {RESULTS_TOKEN}"}).status_code == 200
            assert c.get(route, headers={"authorization": f"bearer  {RESULTS_TOKEN}"}).status_code == 200
        assert c.get("/dashboard").status_code == 200
        assert c.get("/experiments/plan", params={"mean": 0.05, "sd": 0.2, "users_per_day": 1000}).status_code == 200
        if host != "127.0.0.1":  # the admin token reads them too, once admin is on
            admin = settings.model_copy(update={"admin_token": SecretStr(ADMIN_HEADERS["authorization"][7:])})
            with live_server(admin, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as a:
                assert a.get(routes[1], headers=ADMIN_HEADERS).status_code == 200


def test_a_weak_results_token_is_refused_at_start_up():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="results_token"):
        ServingSettings(results_token="changeme-changeme-changeme-changeme")
