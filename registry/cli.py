"""`dinrec models …`: the model registry — publish bundles as immutable versions, list and describe them,
move the aliases serving watches, roll back, read the history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

models_app = typer.Typer(help="The model registry: publish, list, describe, promote, roll back, history "
                              "(JSON out).", no_args_is_help=True)
Alias = Annotated[str, typer.Option("--alias", help="the alias to move (what serving follows)")]
Root = Annotated[str, typer.Option("--registry", envvar="DINREC_REGISTRY",
                                   help="the registry: a folder or s3://bucket/prefix")]


@models_app.command("publish")
def publish(bundle: Path, registry: Root, version: Annotated[str | None, typer.Option(
        help="version name (default: the bundle's model version)")] = None,
            alias: Annotated[str | None, typer.Option(help="then point this alias at it")] = None) -> None:
    """Copy a verified bundle into the registry as a new, immutable version."""
    from dinrec.registry.store import open_registry

    reg = open_registry(registry)
    name = reg.publish(bundle, version)
    if alias:
        reg.set_alias(alias, name)
    typer.echo(json.dumps({"version": name, "alias": alias, "registry": reg.uri}))


def _summary(reg, version: str) -> dict:
    manifest = reg.manifest(version)
    metrics_path = Path(reg.bundle_dir(version)) / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    recall = metrics.get("recall") or {}
    lineage = manifest.get("lineage") or {}
    window = lineage.get("data_window") or {}
    return {"version": version, "model_version": manifest["model_version"], "created_at": manifest.get("created_at"),
            "code_version": manifest.get("code_version"), "test_auc": metrics.get("test_auc"),
            "test_gauc": metrics.get("test_gauc"), "recall_test_hr": recall.get("test_hr"),
            "parent": lineage.get("parent"), "data_window_end": window.get("end"),
            "trained_by": lineage.get("trained_by")}


@models_app.command("list")
def models_list(registry: Root) -> None:
    """Every version with its offline metrics, and where each alias points."""
    from dinrec.registry.store import open_registry

    reg = open_registry(registry)
    typer.echo(json.dumps({"versions": [_summary(reg, v) for v in reg.versions()], "aliases": reg.aliases()}))


@models_app.command("describe")
def models_describe(version: str, registry: Root) -> None:
    """One version: its manifest, metrics, the aliases pointing at it, and every retrain gate's
    evaluation of it (its served HR@10 beside the champion's and the baselines')."""
    from dinrec.registry.store import open_registry

    reg = open_registry(registry)
    metrics_path = Path(reg.bundle_dir(version)) / "metrics.json"
    typer.echo(json.dumps({**_summary(reg, version), "manifest": reg.manifest(version),
                           "metrics": json.loads(metrics_path.read_text()) if metrics_path.is_file() else {},
                           "aliases": sorted(a for a, v in reg.aliases().items() if v == version),
                           "evaluations": reg.evaluations(version)}))


@models_app.command("promote")
def models_promote(version: str, registry: Root, alias: Alias = "champion") -> None:
    """Point the alias at a version (recorded in its history); serving replicas hot-reload it."""
    from dinrec.registry.store import open_registry

    reg = open_registry(registry)
    reg.set_alias(alias, version, reason="promote")
    typer.echo(json.dumps({"alias": alias, "version": version}))


@models_app.command("rollback")
def models_rollback(registry: Root, alias: Alias = "champion") -> None:
    """Point the alias back at the version it held before the current one."""
    from dinrec.registry.store import open_registry

    reg = open_registry(registry)
    was = reg.resolve(alias)
    now = reg.rollback(alias)
    typer.echo(json.dumps({"alias": alias, "version": now, "was": was}))


@models_app.command("history")
def models_history(registry: Root, alias: Alias = "champion") -> None:
    """Every move of the alias, oldest first."""
    from dinrec.registry.store import open_registry

    typer.echo(json.dumps({"alias": alias, "history": open_registry(registry).history(alias)}))
