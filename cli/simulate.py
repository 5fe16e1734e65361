"""`dinrec simulate`: rehearse an A/B experiment end to end against simulated users.

A synthetic world (users with known category interests) → DIN trained on its log → the service
(embedded store, the experiment loaded, the guardrail on) → simulated users request over HTTP, click
by their true interests and a position bias, and send the clicks back → the results JSON, printed.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

EXPERIMENTS = {
    "din-vs-popular": [{"name": "din"}, {"name": "popular", "overrides": {"strategy": "popular"}}],
    "aa": [{"name": "a"}, {"name": "b"}],
    "seq50-vs-seq20": [{"name": "l50"}, {"name": "l20", "overrides": {"seq_len": 20}}],
    # The origin story: a model trained on shuffled labels (lower offline AUC) shipped beside the good one.
    "origin-story": [{"name": "champion"}, {"name": "shuffled", "model": "shuffled"}],
    # The same lists, shown so they tempt clicks and lose buyers: CTR, the goal, rises while conversions per
    # user, the default guardrail, fall — and the guardrail stops the arm on conversions.
    "clickbait": [{"name": "control"}, {"name": "clickbait"}],
}
# How an arm's users respond beyond its list (serving.simulate.Response), by experiment and variant.
RESPONSES = {"clickbait": {"clickbait": {"click": 1.5, "buy": 0.25}}}


def simulate(
    experiment: Annotated[str, typer.Option(help="din-vs-popular, aa, seq50-vs-seq20, origin-story or clickbait")] = \
        "din-vs-popular",
    users: Annotated[int, typer.Option(help="simulated users (the world's first N)")] = 600,
    rounds: Annotated[int, typer.Option(help="requests per user")] = 3,
    k: int = 10, seed: int = 0,
    guardrail_s: Annotated[float, typer.Option(help="guardrail interval while simulating")] = 1.0,
    out: Annotated[Path | None, typer.Option(help="keep the run here (default: a temp dir)")] = None,
) -> None:
    """Run an experiment on simulated users and print its results (JSON on stdout)."""
    import httpx

    from dinrec.datasets.synthetic import SyntheticConfig, generate_world
    from dinrec.experiments import open_state
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.registry.store import Registry
    from dinrec.serving.app import create_app
    from dinrec.serving.server import free_port, serve_in_thread
    from dinrec.serving.settings import ServingSettings
    from dinrec.serving.simulate import Response, wait_until_logged
    from dinrec.serving.simulate import simulate as run
    from dinrec.streams.inprocess import InProcessStream
    from dinrec.training.pipeline import train_bundle
    from dinrec.training.samples import build_samples
    from dinrec.training.settings import TrainSettings

    if experiment not in EXPERIMENTS:
        raise typer.BadParameter(f"choose one of {sorted(EXPERIMENTS)}", param_hint="--experiment")
    say = lambda msg: typer.secho(msg, fg="cyan", err=True)  # noqa: E731
    out = out or Path(tempfile.mkdtemp(prefix="dinrec-simulate-"))
    cfg = SyntheticConfig(n_users=max(users, 600), n_items=800, n_categories=20, mean_events_per_user=30, seed=seed)
    data, world = generate_world(cfg)
    # Negatives as popular as they are: against uniform ones DIN learns mostly popularity, and these
    # users click by interest (README: offline AUC drops, what users are shown gets 7x closer to them).
    samples = build_samples(data, seq_len=50, negatives=1, eval_negatives=20, negative_power=1.0)
    train_settings = TrainSettings(epochs=3, progress=False)
    trained = train_bundle(samples, train_settings, out / "bundle", run_dir=out)
    result, bundle = trained.result, trained.bundle
    assert bundle is not None  # exported: None only on a torchrun rank but the first
    say(f"trained DIN on {len(data)} synthetic behaviours: test AUC {result.metrics['test_auc']:.3f}")
    models = {"champion": {"test_auc": result.metrics["test_auc"]}}
    serving_model: dict = {"bundle_dir": bundle}
    if experiment == "origin-story":  # a second model, trained on the same samples through a broken join
        from dinrec.retrain.drills import degrade_samples  # labels shuffled, item ids remapped (the retrain drill)

        bad_samples = degrade_samples(samples, "shuffled-labels", seed)
        bad_settings = train_settings.model_copy(update={"ranking_blend": False})
        # Served by its DIN score alone: the ranking blend, fitted on validation, would give a model
        # trained on shuffled labels no weight, and the lanes would carry its lists (the blend guards
        # against exactly this); the origin story is a worse *ranker* shipped, and that is what it serves.
        shuffled = train_bundle(bad_samples, bad_settings, out / "shuffled-bundle", run_dir=out / "shuffled-run")
        bad, bad_bundle = shuffled.result, shuffled.bundle
        assert bad_bundle is not None  # exported, as the first
        models["shuffled"] = {"test_auc": bad.metrics["test_auc"]}
        say(f"trained the shuffled-label model: test AUC {bad.metrics['test_auc']:.3f}")
        registry = Registry(out / "registry")
        registry.publish(bundle, "good")
        registry.publish(bad_bundle, "shuffled")
        registry.set_alias("champion", "good")
        serving_model = {"registry": str(registry.root), "model_alias": "champion"}

    exp_file = out / "experiments.json"
    exp_file.write_text(json.dumps({"experiments": [
        {"name": experiment, "status": "running", "seed": f"sim-{seed}", "variants": EXPERIMENTS[experiment]}]}))
    store = MemoryStore(history_cap=50)
    store.write(list(data.events()))
    # The simulated users' client holds the operator's token: its answers name the arm that served them,
    # which the report tallies (a real client's do not: serving.schemas.RecommendResponse).
    token = secrets.token_urlsafe(32)
    settings = ServingSettings(**serving_model, experiments_file=exp_file, events_sink="store", admin_token=token,
                               guardrail_interval_s=guardrail_s, guardrail_min_users=50)
    app = create_app(settings, FeatureStoreSettings(), store=store, stream=InProcessStream())
    port = free_port()
    with serve_in_thread(app, port, name="dinrec-simulate-server"), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                         headers={"authorization": f"Bearer {token}"}) as client:
        t0 = time.perf_counter()
        state = open_state(store)
        responses = {v: Response(**r) for v, r in RESPONSES.get(experiment, {}).items()}
        served = run(client, world, users=users, rounds=rounds, k=k, seed=seed, responses=responses,
                     before_clicks=lambda so_far: wait_until_logged(state, experiment, so_far))
        wait_until_logged(state, experiment, served)
        report = client.get(f"/experiments/{experiment}/results").json()
        say(f"simulated {sum(v['requests'] for v in served.values())} requests in {time.perf_counter() - t0:.0f}s")
    report["served"] = served
    report["models"] = models
    report["world"] = {"users": users, "rounds": rounds, "k": k, "seed": seed,
                       "click_model": "P(click) = (0.01 + 0.6 · interest[user, category]) / log2(position + 2)",
                       "buy_model": "P(buy | click) = 0.05 + 0.5 · interest[user, category]",
                       "responses": RESPONSES.get(experiment, {})}
    typer.echo(json.dumps(report))


