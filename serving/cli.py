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

    from dinrec.serving.app import app_from_env
    from dinrec.serving.http_timeouts import PROTOCOL

    # Through the environment, so that every worker process builds the same settings.
    for name, value in {"BUNDLE_DIR": bundle, "HOST": host, "PORT": port, "WORKERS": workers}.items():
        if value is not None:
            os.environ[f"DINREC_{name}"] = str(value)
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.serving.settings import ServingSettings

    settings = ServingSettings()
    if settings.workers is None:  # a request is CPU work: one process per core, if they can share the store
        settings.workers = (os.cpu_count() or 1) if FeatureStoreSettings().store != "memory" else 1
        os.environ["DINREC_WORKERS"] = str(settings.workers)
    if settings.workers == 1:
        uvicorn.run(app_from_env(), host=settings.host, port=settings.port, log_config=None, http=PROTOCOL,
                    access_log=settings.access_log)
    else:
        made = _shared_by_workers(settings)
        try:
            uvicorn.run("dinrec.serving.app:app_from_env", factory=True, workers=settings.workers, host=settings.host,
                        port=settings.port, log_config=None, http=PROTOCOL, access_log=settings.access_log)
        finally:
            if made is not None:  # a temporary folder of this run's: nothing in it outlives the workers
                import shutil

                shutil.rmtree(made, ignore_errors=True)


def _shared_by_workers(settings) -> str | None:
    """The replica's folder (DINREC_REPLICA_DIR, or a new temporary one) for its workers: their metrics
    files go to ``metrics/`` in it, so /metrics on any of them answers for all (serving.metrics), and the
    guardrail's lead is a lock there (serving.replica). Set before the workers start: they read
    PROMETHEUS_MULTIPROC_DIR when they import prometheus_client. The metrics are emptied: what a previous
    run counted is not this one's. Returns the folder if it was made here (removed when the server stops)."""
    import glob
    import os
    import tempfile

    from dinrec.serving.metrics import MULTIPROCESS_ENV

    folder = str(settings.replica_dir) if settings.replica_dir else tempfile.mkdtemp(prefix="dinrec-replica-")
    metrics = os.path.join(folder, "metrics")
    os.makedirs(metrics, exist_ok=True)
    for stale in glob.glob(os.path.join(metrics, "*.db")):
        os.remove(stale)
    os.environ["DINREC_REPLICA_DIR"] = folder
    os.environ[MULTIPROCESS_ENV] = metrics
    return None if settings.replica_dir else folder
