"""Experiments by API: a token-protected change rewrites the versioned file and applies at once; a
second replica watching the same file follows; a change that does not validate writes nothing."""

from __future__ import annotations

import json

from feature_store.online.memory import MemoryStore
from feature_store.settings import FeatureStoreSettings
from feature_store.streams.inprocess import InProcessStream
from serving.settings import ServingSettings
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
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as one, \
            live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as two:
        assert one.get("/recommend", params={"user_id": user}).json()["experiment"] is None
        assert not path.exists() and one.get("/experiments").json() == {"experiments": []}
        assert one.put("/admin/experiments/late", json=EXP).status_code == 401  # no token
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
