"""Experiments by API: a token-protected change rewrites the versioned file and applies at once; a
second replica watching the same file follows; a change that does not validate writes nothing."""

from __future__ import annotations

import json

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, wait_until
from tests.serving.conftest import live_server

ADMIN = ADMIN_HEADERS
EXP = {"name": "late", "status": "running", "variants": [{"name": "a"}, {"name": "b"}]}


def test_put_and_status_rewrite_the_file_and_every_replica_follows(tiny_run, tmp_path):
    path = tmp_path / "experiments.json"  # not there yet: replicas start with none, the first PUT writes it
    store = MemoryStore()
    user = sorted(set(tiny_run[0].user_id.tolist()))[0]
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, admin_token=ADMIN_TOKEN,
                               events_sink="store", reload_poll_s=0.1, score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as one, \
            live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as two:
        assert one.get("/recommend", params={"user_id": user}).json()["experiment"] is None
        assert not path.exists() and one.get("/experiments").json() == {"experiments": []}
        assert one.put("/admin/experiments/late", json=EXP, headers={"authorization": ""}).status_code == 401
        r = one.put("/admin/experiments/late", json=EXP, headers=ADMIN)
        assert r.status_code == 200 and r.json() == {"version": 1, "experiments": ["late"]}
        assert one.get("/recommend", params={"user_id": user}).json()["experiment"] == "late"  # at once
        wait_until(lambda: two.get("/recommend", params={"user_id": user}).json()["experiment"] == "late",
                   timeout_s=10, what="the other replica to pick up the file")
        assert json.loads(path.read_text())["version"] == 1

        bad = {**EXP, "variants": [{"name": "a"}]}  # one variant: refused by the schema
        assert one.put("/admin/experiments/late", json=bad, headers=ADMIN).status_code == 422
        named_model = {**EXP, "variants": [{"name": "a"}, {"name": "b", "model": "challenger"}]}  # no registry
        assert one.put("/admin/experiments/late", json=named_model, headers=ADMIN).status_code == 409
        assert one.put("/admin/experiments/other", json=EXP, headers=ADMIN).status_code == 409  # name mismatch
        assert json.loads(path.read_text())["version"] == 1  # nothing written by the refusals

        r = one.post("/admin/experiments/late/status", json={"status": "stopped"}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["version"] == 2
        assert one.get("/recommend", params={"user_id": user}).json()["experiment"] is None
        wait_until(lambda: two.get("/recommend", params={"user_id": user}).json()["experiment"] is None,
                   timeout_s=10, what="the other replica to stop the experiment")
        assert one.post("/admin/experiments/nope/status", json={"status": "running"},
                        headers=ADMIN).status_code == 404


def test_two_admin_writers_racing_one_wins_the_other_gets_409_and_nothing_is_lost(tiny_run, tmp_path):
    """Two replicas, each with a client that read version 1: both send their change against it. The first
    lands (version 2); the second is refused with 409 naming version 2, writes nothing, and lands once
    resent against version 2: the document holds both changes. Without If-Match, a change made while
    another replica wrote is refused the same way (the compare-and-swap under every write)."""
    path = tmp_path / "experiments.json"
    store = MemoryStore()
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path, admin_token=ADMIN_TOKEN,
                               events_sink="store", reload_poll_s=0.1, score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as one, \
            live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as two:
        assert one.put("/admin/experiments/late", json=EXP, headers=ADMIN).json()["version"] == 1
        first = {**EXP, "name": "first"}
        second = {**EXP, "name": "second", "status": "draft"}
        r1 = one.put("/admin/experiments/first", json=first, headers={**ADMIN, "If-Match": "1"})
        r2 = two.put("/admin/experiments/second", json=second, headers={**ADMIN, "If-Match": "1"})
        assert r1.status_code == 200 and r1.json()["version"] == 2
        assert r2.status_code == 409 and "at version 2, not 1" in r2.json()["message"], r2.text
        assert json.loads(path.read_text())["version"] == 2  # the refused change wrote nothing
        r2 = two.put("/admin/experiments/second", json=second, headers={**ADMIN, "If-Match": "2"})
        assert r2.status_code == 200 and r2.json() == {"version": 3, "experiments": ["late", "first", "second"]}
        assert [e["name"] for e in json.loads(path.read_text())["experiments"]] == ["late", "first", "second"]
        wait_until(lambda: [e["name"] for e in one.get("/experiments").json()["experiments"]] ==
                   ["late", "first", "second"], timeout_s=10, what="the first replica to follow")
        assert one.put("/admin/experiments/late", json=EXP, headers={**ADMIN, "If-Match": "x"}).status_code == 400


def test_the_list_carries_owner_hypothesis_and_dates_and_a_stopped_experiment_keeps_its_results(tiny_run, tmp_path):
    """Started: dated. Stopped: dated, and its results frozen as they stood — later counts (late clicks,
    a replica still draining its outbox) change nothing the results call shows."""
    from dinrec.experiments import open_state
    from tests.serving.test_guardrail import traffic

    store = MemoryStore()
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=tmp_path / "experiments.json",
                               admin_token=ADMIN_TOKEN, events_sink="store", score_precision="fp32")
    spec = {"name": "late", "status": "draft", "owner": "ranking team", "hypothesis": "b's lists are clicked more",
            "variants": [{"name": "control"}, {"name": "b"}]}
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        assert c.put("/admin/experiments/late", json=spec, headers=ADMIN).status_code == 200
        assert c.put("/admin/experiments/late", json={**spec, "owner": "x" * 201}, headers=ADMIN).status_code == 422
        listed = c.get("/experiments").json()["experiments"][0]
        assert (listed["owner"], listed["hypothesis"], listed["start"], listed["stop"]) == (
            "ranking team", "b's lists are clicked more", None, None)
        assert c.post("/admin/experiments/late/status", json={"status": "running"}, headers=ADMIN).status_code == 200
        started = c.get("/experiments").json()["experiments"][0]["start"]
        assert started is not None
        store.write(traffic("control", 120, 10, 1, experiment="late") + traffic("b", 120, 10, 2, experiment="late"))
        live = c.get("/experiments/late/results").json()
        assert live["frozen_at"] is None and live["results"]["variants"]["b"]["users"] == 120

        assert c.post("/admin/experiments/late/status", json={"status": "stopped"}, headers=ADMIN).status_code == 200
        listed = c.get("/experiments").json()["experiments"][0]
        assert listed["status"] == "stopped" and listed["start"] == started and listed["stop"] >= started
        frozen = c.get("/experiments/late/results").json()
        assert frozen["frozen_at"] is not None and frozen["results"]["variants"] == live["results"]["variants"]
        store.write(traffic("control", 50, 10, 5, "later", experiment="late"))  # counted after the stop
        assert sum(s.users for s in open_state(store).sums("late").values()) == 290
        assert c.get("/experiments/late/results").json()["results"]["variants"] == live["results"]["variants"]
