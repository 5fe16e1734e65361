"""`dinrec serve`: run the HTTP service with uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve(
    bundle: Annotated[Path | None, typer.Option(help="bundle directory (default DINREC_BUNDLE_DIR)")] = None,
    host: Annotated[str | None, typer.Option(help="bind address (default DINREC_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default DINREC_PORT)")] = None,
    workers: Annotated[int | None, typer.Option(
        help="worker processes (default DINREC_WORKERS, else a CPU each with Redis, 1 with the embedded store)",
    )] = None,
) -> None:
    """Serve recommendations over HTTP (store and stream from DINREC_STORE / DINREC_STREAM)."""
    import os

    import uvicorn

    from serving.app import app_from_env
    from serving.http_timeouts import PROTOCOL

    # Through the environment, so that every worker process builds the same settings.
    for name, value in {"BUNDLE_DIR": bundle, "HOST": host, "PORT": port, "WORKERS": workers}.items():
        if value is not None:
            os.environ[f"DINREC_{name}"] = str(value)
    from feature_store.settings import FeatureStoreSettings
    from serving.settings import ServingSettings

    settings = ServingSettings()
    if settings.workers is None:  # a request is CPU work: one process per core, if they can share the store
        settings.workers = (os.cpu_count() or 1) if FeatureStoreSettings().store != "memory" else 1
        os.environ["DINREC_WORKERS"] = str(settings.workers)
    if settings.workers == 1:
        uvicorn.run(app_from_env(), host=settings.host, port=settings.port, log_config=None, http=PROTOCOL)
    else:
        _metrics_shared_by_workers()
        uvicorn.run("serving.app:app_from_env", factory=True, workers=settings.workers, host=settings.host,
                    port=settings.port, log_config=None, http=PROTOCOL)


def _metrics_shared_by_workers() -> None:
    """Workers write their metrics to files in one folder of this replica's, so /metrics on any of them
    answers for all (serving.metrics). Set before the workers start: they read it when they import
    prometheus_client. The operator's PROMETHEUS_MULTIPROC_DIR is used if set; emptied either way,
    since what a previous run counted is not this one's."""
    import glob
    import os
    import tempfile

    from serving.metrics import MULTIPROCESS_ENV

    folder = os.environ.get(MULTIPROCESS_ENV) or tempfile.mkdtemp(prefix="dinrec-metrics-")
    os.makedirs(folder, exist_ok=True)
    for stale in glob.glob(os.path.join(folder, "*.db")):
        os.remove(stale)
    os.environ[MULTIPROCESS_ENV] = folder
