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
from feature_store.cli import data_app
from feature_store.ingest_cli import ingest_app
from serving.cli import serve
from training.cli import train
from training.registry_cli import models_app, registry_app
from training.retrain.cli import retrain
from training.spot.cli import plan, spot_app

app = typer.Typer(help="dinrec: DIN recommendations, from behaviour logs to an HTTP API.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(data_app, name="data")
app.add_typer(ingest_app, name="ingest")
app.command("train")(train)
app.command("plan")(plan)
app.add_typer(registry_app, name="registry")
app.add_typer(models_app, name="models")
app.command("retrain")(retrain)
app.add_typer(spot_app, name="spot")
app.command("serve")(serve)
app.command("demo")(demo)
app.command("simulate")(simulate)
app.add_typer(bench_app, name="bench")


def _quiet_triton_teardown() -> None:
    """At exit, once everything of ours is written: if torch imported Triton (torch.optim imports
    torch._dynamo, which probes for it), hide the leak report its nanobind bindings print while the
    interpreter tears down — a known Triton bug (triton-lang/triton-cpu#278) that Triton silences the
    same way in its own workers; dinrec never runs Triton kernels, and the report reads like a crash."""
    if "triton" not in sys.modules:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def main() -> None:
    from feature_store.errors import FeatureStoreError
    from retrieval.errors import RetrievalError
    from training.bundle import BundleError
    from training.spot.aws import CloudError

    atexit.register(_quiet_triton_teardown)
    try:
        app()
    # expected failures: a message, not a traceback
    except (FeatureStoreError, RetrievalError, CloudError, BundleError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
