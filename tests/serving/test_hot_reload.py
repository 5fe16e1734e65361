"""Models by alias, reloaded hot: moving the alias swaps the model under a request stream without
failing one; a broken bundle is refused and the current model keeps serving; rollback; admin auth."""

from __future__ import annotations

import threading

import pytest

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.models.bundle import load_bundle
from dinrec.registry.store import RegistryError
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, wait_until
from tests.serving.conftest import live_server

ADMIN = ADMIN_HEADERS


def test_moving_the_alias_swaps_the_model_under_load_and_fails_no_request(registry, tiny_run):
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    users = sorted(set(tiny_run[0].user_id.tolist()))[:10]
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.1, admin_token=ADMIN_TOKEN,
                               events_sink="store", score_precision="fp32")
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        v1 = c.get("/admin/model", headers=ADMIN).json()
        assert v1["version"] == "v1" and v1["alias"] == "champion"

        def stream() -> None:
            i = 0
            while not stop.is_set():
                r = c.get("/recommend", params={"user_id": users[i % len(users)], "k": 5})
                seen.append((r.status_code, r.json().get("model_version", "")))
                i += 1

        t = threading.Thread(target=stream)
        t.start()
        wait_until(lambda: len(seen) >= 20, timeout_s=60, what="traffic on v1")
        registry.set_alias("champion", "v2")
        wait_until(lambda: c.get("/admin/model", headers=ADMIN).json()["version"] == "v2", timeout_s=60)
        on_v2 = len(seen)
        wait_until(lambda: len(seen) >= on_v2 + 20, timeout_s=60, what="traffic on v2")
        stop.set()
        t.join(timeout=30)
        v2 = c.get("/admin/model", headers=ADMIN).json()
        assert v2["model_version"] != v1["model_version"] and v2["previous"] == v1["model_version"]

        # A corrupted version is refused; v2 keeps serving.
        registry.publish(registry.bundle_dir("v2"), "v3")
        (registry.bundle_dir("v3") / "popularity.json").write_text("[]")
        registry.set_alias("champion", "v3")
        refused = wait_until(lambda: (m := c.get("/admin/model", headers=ADMIN).json())["held"] == "v3" and m,
                             timeout_s=60, what="the watcher to refuse v3")
        assert refused["version"] == "v2"
        r = c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 409 and "checksum mismatch" in r.json()["message"]
        assert c.get("/recommend", params={"user_id": users[0]}).json()["model_version"] == v2["model_version"]

        # Rollback to the previous model; it sticks while the alias still names what was rolled back
        # from. Admin endpoints need the token.
        registry.set_alias("champion", "v2")
        checks = c.get("/admin/model", headers=ADMIN).json()["watch_checks"]
        wait_until(lambda: c.get("/admin/model", headers=ADMIN).json()["watch_checks"] >= checks + 2,
                   what="the watcher to see the alias back on v2")
        back = c.post("/admin/instance/rollback", headers=ADMIN).json()
        assert back["scope"] == "instance"
        assert back["model_version"] == v1["model_version"]
        assert c.get("/recommend", params={"user_id": users[0]}).json()["model_version"] == v1["model_version"]
        checks = c.get("/admin/model", headers=ADMIN).json()["watch_checks"]
        after = wait_until(lambda: (m := c.get("/admin/model", headers=ADMIN).json())["watch_checks"] >= checks + 2
                           and m, what="two more checks of the alias")
        assert after["model_version"] == v1["model_version"] and after["held"] == "v2"  # it sticks
        assert c.post("/admin/reload", headers={"authorization": ""}).status_code == 401
        assert c.post("/admin/reload", headers={"authorization": "Bearer wrong"}).status_code == 401
        pinned = c.post("/admin/instance/reload", headers=ADMIN, json={"version": "v2"}).json()
        assert pinned["version"] == "v2" and pinned["changed"]
        registry.set_alias("champion", "v1")  # the alias moves on: the watcher follows it again
        wait_until(lambda: c.get("/admin/model", headers=ADMIN).json()["version"] == "v1", timeout_s=30)
    assert {s for s, _ in seen} == {200}
    versions = [v for _, v in seen]
    first_v2 = versions.index(v2["model_version"])
    assert first_v2 > 0 and set(versions[:first_v2]) == {v1["model_version"]}
    assert set(versions[first_v2:]) == {v2["model_version"]}  # swapped once, never back and forth


def test_versions_are_immutable_and_names_checked(registry):
    with pytest.raises(RegistryError, match="immutable"):
        registry.publish(registry.bundle_dir("v1"), "v1")
    with pytest.raises(RegistryError, match="use letters"):
        registry.set_alias("../etc", "v1")
    with pytest.raises(RegistryError, match="no version"):
        registry.set_alias("champion", "v9")
    assert registry.versions() == ["v1", "v2"] and registry.aliases() == {"champion": "v1"}


def test_admin_is_off_without_a_token(tiny_run):
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=MemoryStore(), stream=InProcessStream()) as c:
        r = c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 404 and "DINREC_ADMIN_TOKEN" in r.json()["message"]


@pytest.mark.slow
def test_the_registry_command_publishes_and_moves_aliases(tiny_run, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "DINREC_REGISTRY": str(tmp_path / "reg")}

    def dinrec(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dinrec.cli.main", "models", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    out = dinrec("publish", str(tiny_run[2]), "--version", "a", "--alias", "champion")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["version"] == "a"
    assert dinrec("publish", str(tiny_run[2]), "--version", "b").returncode == 0
    assert dinrec("promote", "b", "--alias", "challenger").returncode == 0
    listed = json.loads(dinrec("list").stdout)
    assert listed["aliases"] == {"champion": "a", "challenger": "b"}
    assert {v["version"] for v in listed["versions"]} == {"a", "b"}
    again = dinrec("publish", str(tiny_run[2]), "--version", "a")
    assert again.returncode == 2 and "immutable" in again.stderr

    def models(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "models", *args], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    listed = models("list")
    assert [v["version"] for v in listed["versions"]] == ["a", "b"]
    assert listed["versions"][0]["test_auc"] == tiny_run[3]["test_auc"]  # the offline metrics travel along
    assert models("describe", "b")["aliases"] == ["challenger"]
    assert models("promote", "b") == {"alias": "champion", "version": "b"}
    assert models("rollback") == {"alias": "champion", "version": "a", "was": "b"}
    moves = models("history")["history"]
    assert [(m["version"], m["previous"], m["reason"]) for m in moves] == [
        ("a", None, "set"), ("b", "a", "promote"), ("a", "b", "rollback from b")]
    nothing = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "models", "rollback", "--alias", "challenger"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert nothing.returncode != 0 and "no earlier version" in nothing.stderr


def test_experiment_variants_serve_the_models_they_name_and_follow_their_alias(registry, tiny_run, tmp_path):
    import json

    v1, v2 = (load_bundle(registry.bundle_dir(v)).model_version for v in ("v1", "v2"))
    registry.set_alias("challenger", "v2")
    path = tmp_path / "experiments.json"
    path.write_text(json.dumps({"experiments": [{"name": "models", "status": "running", "variants": [
        {"name": "champion"}, {"name": "challenger", "model": "challenger"}]}]}))
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    users = sorted(set(tiny_run[0].user_id.tolist()))[:30]
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.1, experiments_file=path,
                               events_sink="store", score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        answers = {u: c.get("/recommend", params={"user_id": u, "k": 3}).json() for u in users}
        arms = {v: {a["model_version"] for a in answers.values() if a["variant"] == v}
                for v in ("champion", "challenger")}
        assert arms == {"champion": {v1}, "challenger": {v2}}
        registry.set_alias("challenger", "v1")  # the challenger alias moves: its arm follows, nothing else does
        user = next(u for u, a in answers.items() if a["variant"] == "challenger")
        wait_until(lambda: c.get("/recommend", params={"user_id": user, "k": 3}).json()["model_version"] == v1,
                   timeout_s=30, what="the challenger arm to follow its alias")


def test_fleet_reload_and_rollback_move_the_alias_and_every_replica_follows(registry, tiny_run):
    """Two replicas on one registry: `POST /admin/reload {"version"}` through one moves the alias (after
    checking the version serves there) and both serve it; `POST /admin/rollback` through the other moves
    it back, recorded; a reload made against a version the alias no longer names is refused (409)."""
    store = MemoryStore()
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.1, admin_token=ADMIN_TOKEN,
                               events_sink="store", score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as one, \
            live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as two:
        def versions() -> tuple[str, str]:
            return tuple(c.get("/admin/model", headers=ADMIN).json()["version"] for c in (one, two))

        assert versions() == ("v1", "v1")
        moved = one.post("/admin/reload", headers=ADMIN, json={"version": "v2"})
        assert moved.status_code == 200 and moved.json()["scope"] == "fleet" and moved.json()["version"] == "v2"
        assert registry.resolve("champion") == "v2" and moved.json()["held"] is None
        wait_until(lambda: versions() == ("v2", "v2"), timeout_s=30, what="every replica to follow the alias")
        stale = two.post("/admin/reload", headers=ADMIN, json={"version": "v1", "expected": "v1"})
        assert stale.status_code == 409 and "holds v2, not v1" in stale.json()["message"]
        assert registry.resolve("champion") == "v2" and versions() == ("v2", "v2")  # the refusal changed nothing
        back = two.post("/admin/rollback", headers=ADMIN)
        assert back.status_code == 200 and back.json()["scope"] == "fleet" and back.json()["version"] == "v1"
        assert registry.resolve("champion") == "v1"
        assert registry.history("champion")[-1]["reason"] == "rollback from v2"
        wait_until(lambda: versions() == ("v1", "v1"), timeout_s=30, what="every replica to roll back")
        registry.publish(registry.bundle_dir("v2"), "v3")
        (registry.bundle_dir("v3") / "popularity.json").write_text("[]")  # corrupt: fails its checksum
        refused = one.post("/admin/reload", headers=ADMIN, json={"version": "v3"})
        assert refused.status_code == 409 and registry.resolve("champion") == "v1"  # checked first: nothing moved


def test_a_fleet_reload_whose_alias_cannot_be_written_serves_what_the_alias_names(registry, caplog):
    """The alias' history cannot be written (a folder that is a file: a fault root cannot write through
    either): the reload answers 503, the worker serves what the alias still names — not a version the
    alias does not name — and the audit says what happened. With the folder back, the same move goes through."""
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=3600, admin_token=ADMIN_TOKEN,
                               events_sink="store", score_precision="fp32")
    history = registry.root / "alias-history" / "champion"
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream(),
                     operator=True) as c:
        served = c.get("/admin/model").json()
        assert served["version"] == "v1"
        history.rename(history.with_name("champion.kept"))
        history.write_text("not a folder")
        with caplog.at_level("WARNING", logger="dinrec.audit"):
            r = c.post("/admin/reload", json={"version": "v2"})
        assert r.status_code == 503 and "could not be moved" in r.json()["message"], r.text
        now = c.get("/admin/model").json()
        assert (now["version"], now["model_version"]) == ("v1", served["model_version"])
        assert registry.resolve("champion") == "v1"
        (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "dinrec.audit"]
        assert "admin reload failed" in line and "version='v2'" in line and "serving=" in line
        history.unlink()
        history.with_name("champion.kept").rename(history)
        assert c.post("/admin/reload", json={"version": "v2"}).status_code == 200
        assert registry.resolve("champion") == "v2" and c.get("/admin/model").json()["version"] == "v2"


def test_a_fleet_rollback_to_a_version_that_cannot_serve_moves_nothing(registry):
    """The version a rollback would return to is checked to serve here before the alias moves: a broken
    bundle is refused (409) with the alias where it was, not an alias naming a version nobody serves."""
    registry.set_alias("champion", "v2", reason="test: a move to roll back")
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=3600, admin_token=ADMIN_TOKEN,
                               events_sink="store", score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream(),
                     operator=True) as c:
        assert c.get("/admin/model").json()["version"] == "v2"
        largest = max((p for p in registry.bundle_dir("v1").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        largest.write_bytes(largest.read_bytes()[:-64])  # a torn copy: its checksum no longer holds
        r = c.post("/admin/rollback")
        assert r.status_code == 409 and "cannot serve v1" in r.json()["message"], r.text
        assert registry.resolve("champion") == "v2" and c.get("/admin/model").json()["version"] == "v2"


def test_a_new_deployment_waits_for_its_first_model_and_accepts_events_meanwhile(tiny_run, tmp_path):
    """An empty registry (no alias yet) does not stop the service: events are accepted (the first retrain
    trains on them), /recommend answers 503 no_model, /readyz says why; once the alias names a version,
    the watcher loads it and the same process serves."""
    from dinrec.registry.store import Registry

    registry = Registry(tmp_path / "registry")
    store = MemoryStore()
    user = str(tiny_run[0].user_id[0])
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.1, admin_token=ADMIN_TOKEN,
                               events_sink="store", score_precision="fp32")
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream(), operator=True) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"] == "not_ready"
        assert "'champion' names no version" in ready.json()["message"]
        r = c.get("/recommend", params={"user_id": user})
        assert r.status_code == 503 and r.json()["error"] == "no_model" and r.headers["retry-after"] == "30"
        status = c.get("/admin/model", headers=ADMIN).json()
        assert status["model_version"] is None and status["version"] is None
        event = {"event_id": "first-1", "user_id": user, "item_id": str(tiny_run[0].item_id[0]),
                 "category_id": str(tiny_run[0].category_id[0]), "event_type": "click", "ts": 1.0}
        assert c.post("/events", json={"events": [event]}).status_code == 202
        assert [h.item_id for h in store.history(user, 10)] == [event["item_id"]]
        assert c.post("/admin/instance/rollback", headers=ADMIN).status_code == 409  # nothing to go back to

        registry.publish(tiny_run[2], "v1")
        registry.set_alias("champion", "v1")
        wait_until(lambda: c.get("/readyz").status_code == 200, timeout_s=60, what="the first model to load")
        answer = c.get("/recommend", params={"user_id": user, "k": 5}).json()
        assert len(answer["items"]) == 5 and answer["model_version"]
        model = c.get("/admin/model", headers=ADMIN).json()
        assert model["version"] == "v1" and model["previous"] is None
        assert 'dinrec_model_info{' in c.get("/metrics").text
