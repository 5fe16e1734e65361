"""`dinrec registry …`: publish bundles as immutable versions and move aliases (what serving watches)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

registry_app = typer.Typer(help="The model registry: immutable versions, movable aliases.", no_args_is_help=True)
Root = Annotated[str, typer.Option("--registry", envvar="DINREC_REGISTRY",
                                   help="the registry: a folder or s3://bucket/prefix")]


@registry_app.command("publish")
def publish(bundle: Path, registry: Root, version: Annotated[str | None, typer.Option(
        help="version name (default: the bundle's model version)")] = None,
            alias: Annotated[str | None, typer.Option(help="then point this alias at it")] = None) -> None:
    """Copy a verified bundle into the registry as a new, immutable version."""
    from training.registry import open_registry

    reg = open_registry(registry)
    name = reg.publish(bundle, version)
    if alias:
        reg.set_alias(alias, name)
    typer.echo(json.dumps({"version": name, "alias": alias, "registry": reg.uri}))


@registry_app.command("alias")
def alias(name: str, version: str, registry: Root) -> None:
    """Point an alias (champion, challenger, …) at a version; services watching it reload."""
    from training.registry import open_registry

    open_registry(registry).set_alias(name, version)
    typer.echo(json.dumps({"alias": name, "version": version}))


@registry_app.command("list")
def list_(registry: Root) -> None:
    """Versions (with their model versions) and aliases, as JSON."""
    from training.registry import open_registry

    reg = open_registry(registry)
    typer.echo(json.dumps({"versions": {v: reg.manifest(v)["model_version"] for v in reg.versions()},
                           "aliases": reg.aliases()}))
