"""`dinrec data …` (`dinrec ingest …` is in ingest_cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(help="Behaviour datasets: synthesize, inspect.", no_args_is_help=True)


@data_app.command("synth")
def synth(
    out: Annotated[Path, typer.Option(help="folder to write events.jsonl into")],
    users: int = 2000, items: int = 3000, categories: int = 40, events_per_user: int = 40,
    seed: int = 0,
) -> None:
    """Write a deterministic synthetic behaviour log (drifting interests, Zipf items, new items)."""
    from dinrec.datasets.detect import EVENTS_FILE
    from dinrec.datasets.synthetic import SyntheticConfig, generate
    from dinrec.events.schema import dumps_many

    d = generate(SyntheticConfig(n_users=users, n_items=items, n_categories=categories,
                                 mean_events_per_user=events_per_user, seed=seed))
    out.mkdir(parents=True, exist_ok=True)
    (out / EVENTS_FILE).write_text(dumps_many(list(d.events())))
    typer.echo(json.dumps({"events": len(d), "users": len(set(d.user_id)), "items": len(set(d.item_id)),
                           "path": str(out / EVENTS_FILE)}))


@data_app.command("info")
def info(path: Path) -> None:
    """Recognise a dataset folder's layout and print its size as JSON."""
    from dinrec.datasets import detect_layout, load_dataset

    d = load_dataset(path)
    b = d.behaviours()
    typer.echo(json.dumps({"layout": detect_layout(path), "events": len(d), "behaviours": len(b),
                           "users": len(set(b.user_id)), "items": len(set(b.item_id)),
                           "categories": len(set(b.category_id)), "fingerprint": d.fingerprint()}))
