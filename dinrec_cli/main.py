"""`dinrec`: one command, each package's sub-commands.

This is the composition root: it is the one place allowed to import every layer.
"""

from __future__ import annotations

import atexit
import os
import sys

import typer

from benchmarks.cli import bench_app
from dinrec_cli.demo import demo
from dinrec_cli.simulate import simulate
from dinrec_cli.teardown import quiet_triton_teardown
from feature_store.cli import data_app
from feature_store.ingest_cli import ingest_app
from registry.cli import models_app
from retrain.cli import retrain
from serving.cli import serve
from spot.cli import plan, spot_app
from training.cli import train

app = typer.Typer(help="dinrec: DIN recommendations, from behaviour logs to an HTTP API.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(data_app, name="data")
app.add_typer(ingest_app, name="ingest")
app.command("train")(train)
app.command("plan")(plan)
app.add_typer(models_app, name="models")
app.command("retrain")(retrain)
app.add_typer(spot_app, name="spot")
app.command("serve")(serve)
app.command("demo")(demo)
app.command("simulate")(simulate)
app.add_typer(bench_app, name="bench")


@app.command("config")
def config() -> None:
    """Print the configuration reference: every DINREC_* variable, its type, default and meaning."""
    from dinrec_cli.config import reference

    typer.echo(reference(), nl=False)


def main() -> None:
    from dinrec_cli.config import unknown_warnings
    from feature_store.errors import FeatureStoreError
    from models.errors import BundleError
    from retrieval.errors import RetrievalError
    from storage import CloudError

    atexit.register(quiet_triton_teardown)
    for line in unknown_warnings(os.environ):  # a mistyped variable would otherwise be dropped silently
        typer.echo(line, err=True)
    try:
        app()
    # expected failures: a message, not a traceback
    except (FeatureStoreError, RetrievalError, CloudError, BundleError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
