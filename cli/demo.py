"""`dinrec demo`: the whole loop on embedded defaults, no servers needed.

synthetic behaviours → point-in-time samples → DIN → bundle + FAISS → the FastAPI service on the
in-process store, fed through the in-process stream → sample requests, printed → a short A/B
experiment (DIN vs popularity) started through the admin API and run on simulated users, whose
results the dashboard shows → the stream archived and `dinrec retrain`'s job run on it: the candidate
against the champion on the users' new clicks, promoted only through the gate (the service follows
the registry alias and reloads it).
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

if TYPE_CHECKING:
    from dinrec.datasets.base import Interactions
    from dinrec.datasets.synthetic import World


def demo(
    smoke: Annotated[bool, typer.Option("--smoke", help="small data, exit after the sample requests")] = False,
    out: Annotated[Path | None, typer.Option(help="keep the run here (default: a temp dir)")] = None,
    port: Annotated[int, typer.Option(help="port to serve on (0 = a free one)")] = 0,
    seed_registry: Annotated[str | None, typer.Option("--seed-registry", help=(
        "instead: train the demo's model, publish it to this registry (a folder or s3://bucket/prefix) under "
        "--alias unless that alias already names a model, print what was done as JSON and exit — a trial "
        "deployment then serves before its first retrain, which replaces the model through the gate"))] = None,
    alias: Annotated[str, typer.Option(help="with --seed-registry: the alias serving follows",
                                       envvar="DINREC_MODEL_ALIAS")] = "champion",
) -> None:
    """Run the whole loop on a laptop: data → DIN → bundle + FAISS → HTTP, and show requests."""
    say = lambda msg: typer.secho(msg, fg="cyan", err=True)  # noqa: E731
    out = out or Path(tempfile.mkdtemp(prefix="dinrec-demo-"))
    if seed_registry is not None:
        typer.echo(json.dumps(seed(seed_registry, alias, smoke=smoke, out=out, say=say)))
        return
    _demo(smoke, out, port, say)


def _demo(smoke: bool, out: Path, port: int, say: Callable[[str], None]) -> None:
    import httpx

    from dinrec.experiments import open_state
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.registry.store import Registry
    from dinrec.serving.app import create_app
    from dinrec.serving.server import free_port, serve_in_thread
    from dinrec.serving.settings import ServingSettings
    from dinrec.serving.simulate import simulate, wait_until_logged
    from dinrec.streams.inprocess import InProcessStream

    t0 = time.perf_counter()
    first = _first_model(smoke, out, say, progress=not smoke, steps=7, trained_by="dinrec demo")
    data, later, world, bundle = first.data, first.later, first.world, first.bundle
    registry = Registry(out / "registry")
    registry.set_alias("champion", registry.publish(bundle), reason="demo: first model")
    say(f"4/7 exported bundle + FAISS index to {bundle}, published as champion in {registry.root}")

    store, stream = MemoryStore(history_cap=50), InProcessStream()
    experiments = out / "experiments.json"
    experiments.write_text('{"experiments": []}')
    token = secrets.token_urlsafe(32)
    app = create_app(ServingSettings(registry=str(registry.root), reload_poll_s=0.5, experiments_file=experiments,
                                     admin_token=token, guardrail_interval_s=1.0, guardrail_min_users=50),
                     FeatureStoreSettings(), store=store, stream=stream)
    port = port or free_port()
    with serve_in_thread(app, port, name="dinrec-demo-server") as thread:
        stream.publish(list(data.events("a-")))  # the service's ingest thread moves them into the store
        deadline = time.monotonic() + 60
        while store.applied_behaviours() < len(data):
            if time.monotonic() > deadline:
                raise RuntimeError("ingestion did not finish")
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        say(f"5/7 serving on {base}; ingested {len(data)} events through the in-process stream")

        def show(method: str, path: str, **kw) -> dict:
            r = client.request(method, base + path, **kw)
            sent = f"  {json.dumps(kw['json'])}" if "json" in kw else ""
            typer.echo(f"\n{method} {path}{sent}  → {r.status_code}")
            body = r.json()
            typer.echo(json.dumps(body, indent=1)[:1200])
            return body

        # The walkthrough is the operator's (the admin token): its answers also say which model and strategy
        # served each list; a client's carry the list alone (docs/serving.md).
        with httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}"}) as client:
            say("the answers below are the operator's view (admin token): a client's answer has the same list "
                "without model_version, strategy, history_len, experiment and variant")
            user = data.user_id[0]
            show("GET", f"/recommend?user_id={user}&k=5")
            show("POST", "/recommend", json={"user_id": data.user_id[-1], "k": 3})
            show("GET", "/recommend?user_id=someone-new&k=3")
            last_ts = float(data.ts.max()) + 60
            new_items = [i for i, _ in store.popular(50)][-3:]
            show("POST", "/events", json={"events": [
                {"event_id": f"demo-click-{j}", "user_id": "someone-new", "item_id": it, "category_id": "?",
                 "event_type": "click", "ts": last_ts + j}
                for j, it in enumerate(new_items)]})
            deadline = time.monotonic() + 30  # the events travel stream → ingest thread → store
            while len(store.history("someone-new", 10)) < len(new_items) and time.monotonic() < deadline:
                time.sleep(0.05)
            show("GET", "/recommend?user_id=someone-new&k=3")
            show("GET", "/recommend?user_id=&k=3")
            show("GET", "/readyz")

            # A short experiment: started through the admin API, run on simulated users of the same world.
            show("PUT", "/admin/experiments/din-vs-popular", headers={"authorization": f"Bearer {token}"}, json={
                "name": "din-vs-popular", "status": "running", "seed": "demo",
                "variants": [{"name": "din"}, {"name": "popular", "overrides": {"strategy": "popular"}}]})
            users = 300 if smoke else 1000
            ab = open_state(store)
            operator = httpx.Client(base_url=base, timeout=30, headers={"authorization": f"Bearer {token}"})
            served = simulate(operator, world, users=users, rounds=2, k=10,  # tallied per arm: the operator's view
                              before_clicks=lambda so_far: wait_until_logged(ab, "din-vs-popular", so_far))
            wait_until_logged(ab, "din-vs-popular", served)
            clicked, deadline = sum(v["clicked"] for v in served.values()), time.monotonic() + 30
            while (sum(s.clicks for s in ab.sums("din-vs-popular").values()) + ab.unattributed()["orphan_clicks"]
                   < clicked and time.monotonic() < deadline):  # the clicks travel stream → ingest → store too
                time.sleep(0.05)
            results = client.get(base + "/experiments/din-vs-popular/results").json()
            ctrs = ", ".join(f"{v} CTR {100 * s['ctr']:.2f}%" for v, s in results["results"]["variants"].items())
            lifts = "".join(f"; {c['variant']} lift {100 * c['lift']:+.1f}% (p = {c['p_value']:.2g}, "
                            f"sequential: {c['sequential']})" for c in results["results"]["comparisons"])
            say(f"6/7 ran an experiment on {users} simulated users: {ctrs}{lifts}; dashboard: {base}/dashboard")
            # A stopped arm's users leave the experiment: their later lists are served outside it, and clicks on
            # those cannot count for an arm: the results page shows them as unattributed.
            outside = served.get("(none)", {}).get("clicked", 0)
            say(f"    unattributed clicks: {results['unattributed']['orphan_clicks']}; clicks on lists served outside "
                f"the experiment: {outside} (stopped: {', '.join(results['stopped']) or 'none'})")
            stream.publish(list(later.events("b-")))
            say(f"    {len(later)} more behaviours arrived through the stream (new items among them)")
            report = _retrain(out, stream, registry, say, smoke)
            admin = {"authorization": f"Bearer {token}"}
            model = client.get(base + "/admin/model", headers=admin).json()
            deadline = time.monotonic() + 30  # a promotion: the service follows the alias on its next poll
            while (report["status"] == "promoted" and model["version"] != report["candidate"]["version"]
                   and time.monotonic() < deadline):
                time.sleep(0.1)
                model = client.get(base + "/admin/model", headers=admin).json()
            say(f"    serving {model['version']} (alias {model['alias']})")

        typer.secho(f"\ndemo finished in {time.perf_counter() - t0:.0f}s; artefacts in {out}", fg="green", err=True)
        if not smoke:
            typer.secho(f"still serving on {base} — Ctrl-C to stop", fg="green", err=True)
            try:
                while thread.is_alive():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass


@dataclass(frozen=True)
class _FirstModel:
    data: Interactions  # the log the model was trained on
    later: Interactions  # the behaviours held back: they arrive after the model (step 7's retrain)
    world: World  # the simulated users behind the log
    bundle: Path


def _first_model(smoke: bool, out: Path, say: Callable[[str], None], *, progress: bool, steps: int,
                 trained_by: str) -> _FirstModel:
    """Steps 1–3 (of ``steps``): a synthetic world's log (its last 15 % held back), samples, DIN trained and
    exported."""
    from dinrec.datasets.synthetic import SyntheticConfig, generate_world
    from dinrec.training.pipeline import train_bundle
    from dinrec.training.samples import build_samples
    from dinrec.training.settings import TrainSettings

    cfg = SyntheticConfig(n_users=600, n_items=800, n_categories=20, mean_events_per_user=30) if smoke \
        else SyntheticConfig()
    data, world = generate_world(cfg)
    # The last 15 % of the log (by time) arrives later, before the retrain at the end (step 7).
    cut = float(np.quantile(data.ts, 0.85))
    data, later = data.take(np.flatnonzero(data.ts < cut)), data.take(np.flatnonzero(data.ts >= cut))
    say(f"1/{steps} synthesized {len(data) + len(later)} behaviours of {cfg.n_users} users over {cfg.n_items} items "
        f"({len(later)} held back for later)")
    # Negatives as popular as they are: the simulated users click by interest, not by popularity.
    samples = build_samples(data, seq_len=50, negatives=1, eval_negatives=20, negative_power=1.0)
    say(f"2/{steps} built {len(samples.train)} train / {len(samples.val)} val / {len(samples.test)} test samples")
    settings = TrainSettings(epochs=3, progress=progress)
    # The data window goes into the bundle's lineage: what a retrain compares against (its holdout is
    # the behaviours after it).
    window = {"start": float(data.ts.min()), "end": cut, "source": data.source}
    trained = train_bundle(samples, settings, out / "bundle", run_dir=out,
                           lineage={"trained_by": trained_by, "data_window": window})
    assert trained.bundle is not None  # exported: None only on a torchrun rank but the first
    m = trained.result.metrics
    say(f"3/{steps} trained DIN: test AUC {m['test_auc']:.4f}, GAUC {m['test_gauc']:.4f}, "
        f"{m['samples_per_s']:.0f} samples/s")
    return _FirstModel(data, later, world, Path(trained.bundle))


def seed(location: str, alias: str, *, smoke: bool, out: Path, say: Callable[[str], None]) -> dict:
    """A first model for a deployment with none: the demo's, published under ``alias`` only while that
    alias names nothing — a champion already there (a retrain's, an operator's, an earlier seed's) stays,
    and nothing is trained. Its data window (the synthetic log's, in 2023) ends before any real
    behaviour, so the first retrain measures its candidate against it on every behaviour it has."""
    from dinrec.registry.store import AliasConflict, UnknownAlias, open_registry

    registry = open_registry(location, out / "registry-cache")

    def kept(version: str) -> dict:
        say(f"{alias} already names {version} in {registry.uri}: nothing seeded")
        return {"status": "kept", "alias": alias, "version": version, "registry": registry.uri}

    try:
        return kept(registry.resolve(alias))
    except UnknownAlias:
        pass
    first = _first_model(smoke, out, say, progress=sys.stderr.isatty(), steps=4,
                         trained_by="dinrec demo --seed-registry")
    version = registry.publish(first.bundle)
    try:  # only if the alias is still unset: a retrain (or a second seeder) that got there first wins
        registry.set_alias(alias, version, reason="seed: dinrec demo --seed-registry", expected=None)
    except AliasConflict:
        return kept(registry.resolve(alias))
    say(f"4/4 published the demo's model as {version} and pointed {alias} at it in {registry.uri}")
    return {"status": "seeded", "alias": alias, "version": version, "registry": registry.uri}


def _retrain(out: Path, stream, registry, say, smoke: bool) -> dict:
    """Archive the stream (the synthetic log, and the simulated users' impressions and clicks) and run
    the retrain job on it; returns its report."""
    from dinrec.retrain.job import RetrainJob
    from dinrec.retrain.settings import RetrainSettings
    from dinrec.streams.archive import Archiver
    from dinrec.training.settings import TrainSettings

    archiver = Archiver(stream, out / "archive", "dinrec-demo-archive", max_file_age_s=1.0)
    try:
        stats = archiver.run(idle_exit_s=2.0)
    finally:
        archiver.close()
    settings = RetrainSettings(archive_dir=str(out / "archive"), registry=str(registry.root), work_dir=out / "retrain",
                               history_days=3650, min_new_events=50, min_holdout_users=20)
    train = TrainSettings(epochs=3, negative_power=1.0, recall_epochs=10 if smoke else 20)
    report = RetrainJob(settings, train, until=time.time() + 1).run().report
    line = f"7/7 archived {stats.records} events; retrain: {report['status']} — {report.get('reason')}"
    if "candidate" in report:
        cand, champ = report["candidate"]["holdout"], report["champion"]["holdout"]
        line += (f" (holdout of {cand['users']} users' new clicks: GAUC {cand['gauc']:.3f} vs champion "
                 f"{champ['gauc']:.3f}, HR@200 {cand['recall_hr']:.3f} vs {champ['recall_hr']:.3f})")
    say(line)
    return report
