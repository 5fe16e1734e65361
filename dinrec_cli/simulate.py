"""`dinrec simulate`: rehearse an A/B experiment end to end against simulated users.

A synthetic world (users with known category interests) → DIN trained on its log → the service
(embedded store, the experiment loaded, the guardrail on) → simulated users request over HTTP, click
by their true interests and a position bias, and send the clicks back → the results JSON, printed.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

EXPERIMENTS = {
    "din-vs-popular": [{"name": "din"}, {"name": "popular", "overrides": {"strategy": "popular"}}],
    "aa": [{"name": "a"}, {"name": "b"}],
    "seq50-vs-seq20": [{"name": "l50"}, {"name": "l20", "overrides": {"seq_len": 20}}],
}


def simulate(
    experiment: Annotated[str, typer.Option(help="din-vs-popular, aa or seq50-vs-seq20")] = "din-vs-popular",
    users: Annotated[int, typer.Option(help="simulated users (the world's first N)")] = 600,
    rounds: Annotated[int, typer.Option(help="requests per user")] = 3,
    k: int = 10, seed: int = 0,
    guardrail_s: Annotated[float, typer.Option(help="guardrail interval while simulating")] = 1.0,
    out: Annotated[Path | None, typer.Option(help="keep the run here (default: a temp dir)")] = None,
) -> None:
    """Run an experiment on simulated users and print its results (JSON on stdout)."""
    import httpx

    from feature_store.datasets.synthetic import SyntheticConfig, generate_world
    from feature_store.online.memory import MemoryStore
    from feature_store.settings import FeatureStoreSettings
    from feature_store.streams.inprocess import InProcessStream
    from serving.app import create_app
    from serving.server import free_port, serve_in_thread
    from serving.settings import ServingSettings
    from serving.simulate import simulate as run
    from training.export import export_with_recall
    from training.loop import train
    from training.samples import build_samples
    from training.settings import TrainSettings

    if experiment not in EXPERIMENTS:
        raise typer.BadParameter(f"choose one of {sorted(EXPERIMENTS)}", param_hint="--experiment")
    say = lambda msg: typer.secho(msg, fg="cyan", err=True)  # noqa: E731
    out = out or Path(tempfile.mkdtemp(prefix="dinrec-simulate-"))
    cfg = SyntheticConfig(n_users=max(users, 600), n_items=800, n_categories=20, mean_events_per_user=30, seed=seed)
    data, world = generate_world(cfg)
    samples = build_samples(data, seq_len=50, negatives=1, eval_negatives=20)
    train_settings = TrainSettings(epochs=3, progress=False)
    result = train(samples, train_settings, out)
    bundle = export_with_recall(out / "bundle", result.model, samples, result.metrics, train_settings)
    say(f"trained DIN on {len(data)} synthetic behaviours: test AUC {result.metrics['test_auc']:.3f}")

    exp_file = out / "experiments.json"
    exp_file.write_text(json.dumps({"experiments": [
        {"name": experiment, "status": "running", "seed": f"sim-{seed}", "variants": EXPERIMENTS[experiment]}]}))
    store = MemoryStore(history_cap=50)
    store.write(list(data.events()))
    settings = ServingSettings(bundle_dir=bundle, experiments_file=exp_file, events_sink="store",
                               guardrail_interval_s=guardrail_s, guardrail_min_users=50)
    app = create_app(settings, FeatureStoreSettings(), store=store, stream=InProcessStream())
    port = free_port()
    with serve_in_thread(app, port, name="dinrec-simulate-server"), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        t0 = time.perf_counter()
        served = run(client, world, users=users, rounds=rounds, k=k, seed=seed)
        shown = sum(v["shown"] for name, v in served.items() if name != "(none)")
        deadline = time.monotonic() + 60  # impressions are logged in the background: wait for all of them
        while sum(s.impressions for s in store.ab_sums(experiment).values()) < shown:
            if time.monotonic() > deadline:
                raise RuntimeError("impressions were not all logged")
            time.sleep(0.05)
        report = client.get(f"/experiments/{experiment}/results").json()
        say(f"simulated {sum(v['requests'] for v in served.values())} requests in {time.perf_counter() - t0:.0f}s")
    report["served"] = served
    report["world"] = {"users": users, "rounds": rounds, "k": k, "seed": seed,
                       "click_model": "P(click) = (0.01 + 0.6 · interest[user, category]) / log2(position + 2)"}
    typer.echo(json.dumps(report))


