"""`dinrec data …`, `dinrec ingest` and `dinrec events …`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(help="Behaviour datasets: synthesize, inspect.", no_args_is_help=True)
events_app = typer.Typer(help="Publish behaviour events to the configured stream.", no_args_is_help=True)


@data_app.command("synth")
def synth(
    out: Annotated[Path, typer.Option(help="folder to write events.jsonl into")],
    users: int = 2000, items: int = 3000, categories: int = 40, events_per_user: int = 40,
    seed: int = 0,
) -> None:
    """Write a deterministic synthetic behaviour log (drifting interests, Zipf items, new items)."""
    from feature_store.datasets.detect import EVENTS_FILE
    from feature_store.datasets.synthetic import SyntheticConfig, generate
    from feature_store.schema import dumps_many

    d = generate(SyntheticConfig(n_users=users, n_items=items, n_categories=categories,
                                 mean_events_per_user=events_per_user, seed=seed))
    out.mkdir(parents=True, exist_ok=True)
    (out / EVENTS_FILE).write_text(dumps_many(list(d.events())))
    typer.echo(json.dumps({"events": len(d), "users": len(set(d.user_id)), "items": len(set(d.item_id)),
                           "path": str(out / EVENTS_FILE)}))


@data_app.command("info")
def info(path: Path) -> None:
    """Recognise a dataset folder's layout and print its size as JSON."""
    from feature_store.datasets import detect_layout, load_dataset

    d = load_dataset(path)
    b = d.behaviours()
    typer.echo(json.dumps({"layout": detect_layout(path), "events": len(d), "behaviours": len(b),
                           "users": len(set(b.user_id)), "items": len(set(b.item_id)),
                           "categories": len(set(b.category_id)), "fingerprint": d.fingerprint()}))


@events_app.command("publish")
def publish(path: Annotated[Path, typer.Argument(help="a dataset folder or an events.jsonl file")],
            limit: int = 0) -> None:
    """Publish a dataset's events to the configured stream (DINREC_STREAM, DINREC_KAFKA_BOOTSTRAP)."""
    from feature_store.datasets import load_dataset
    from feature_store.settings import FeatureStoreSettings
    from feature_store.streams import open_stream

    settings = FeatureStoreSettings()
    events = list(load_dataset(path).events())
    events = events[:limit] if limit else events
    stream = open_stream(settings)
    stream.ensure_topic(settings.topic_partitions, settings.topic_replication)
    for i in range(0, len(events), 1000):
        stream.publish(events[i:i + 1000])
    stream.close()
    typer.echo(json.dumps({"published": len(events), "stream": settings.stream, "topic": settings.topic}))
