"""`dinrec`: one command, each package's sub-commands.

This is the composition root: it is the one place allowed to import every layer.
"""

from __future__ import annotations

import atexit
import os
import sys

import typer

from dinrec.benchmarks.cli import bench_app
from dinrec.cli.demo import demo
from dinrec.cli.simulate import simulate
from dinrec.cli.teardown import quiet_triton_teardown
from dinrec.datasets.cli import data_app
from dinrec.feature_store.ingest_cli import ingest_app
from dinrec.registry.cli import models_app
from dinrec.retrain.cli import retrain
from dinrec.serving.cli import serve
from dinrec.spot.cli import plan, spot_app
from dinrec.training.cli import train

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

EXIT_USAGE = 2  # a mistyped setting, a bad file, a refused input: retrying the same command cannot help
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: a dependency is down; the same command may succeed later (spot's and
# retrain's "stopped after a checkpoint, run again" is 75 too: both mean "retry")


def _print_version(asked: bool) -> None:
    if asked:
        from dinrec.models.bundle import code_version

        typer.echo(f"dinrec {code_version()}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the installed dinrec's version and exit")) -> None:
    """dinrec: DIN recommendations, from behaviour logs to an HTTP API."""


@app.command("config")
def config() -> None:
    """Print the configuration reference: every DINREC_* variable, its type, default and meaning."""
    from dinrec.cli.config import reference

    typer.echo(reference(), nl=False)


def _configure_logging() -> None:
    """Every process logs the same way: DINREC_LOG_FORMAT (json, the default, or text), warnings and
    above (the services — serve, ingest, retrain — raise their own level to info)."""
    import logging

    from pydantic import TypeAdapter, ValidationError

    from dinrec.serving import logs
    from dinrec.serving.settings import ServingSettings

    field = ServingSettings.model_fields["log_format"]  # the one definition of the setting and its values
    assert field.annotation is not None  # a declared field: pydantic's None is for ones built without a type
    value = os.environ.get("DINREC_LOG_FORMAT", field.default)
    try:
        fmt = TypeAdapter(field.annotation).validate_python(value)
    except ValidationError as exc:
        raise ValueError(f"DINREC_LOG_FORMAT={value!r}: {exc.errors()[0]['msg']}") from None
    logs.configure(fmt, logging.WARNING)


def main() -> None:
    from dinrec.cli.config import unknown_warnings
    from dinrec.feature_store.errors import FeatureStoreError
    from dinrec.models.errors import BundleError
    from dinrec.retrieval.errors import RetrievalError
    from dinrec.storage import CloudError, outage
    from dinrec.storage.outage import MissingDependency
    from dinrec.streams.errors import StreamError

    atexit.register(quiet_triton_teardown)
    for line in unknown_warnings(os.environ):  # a mistyped variable would otherwise be dropped silently
        typer.echo(line, err=True)
    try:
        _configure_logging()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        app()
    except Exception as exc:  # expected failures: a message and an exit code that says what to do, no traceback
        down = outage(exc)
        if down is not None:  # anywhere in the causes: a registry error raised from an unreachable S3 is one
            typer.echo(f"error: {exc}\n(a dependency is unavailable: {type(down).__name__}; retry later)", err=True)
            sys.exit(EXIT_TEMPFAIL)
        if isinstance(exc, (FeatureStoreError, StreamError, MissingDependency, RetrievalError, CloudError, BundleError,
                            ValueError)):
            typer.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        raise


if __name__ == "__main__":
    main()
