"""`dinrec serve`: run the HTTP service with uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve(
    bundle: Annotated[Path | None, typer.Option(help="bundle directory (default DINREC_BUNDLE_DIR)")] = None,
    host: Annotated[str | None, typer.Option(help="bind address (default DINREC_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default DINREC_PORT)")] = None,
) -> None:
    """Serve recommendations over HTTP (store and stream from DINREC_STORE / DINREC_STREAM)."""
    import logging

    import uvicorn

    from feature_store.settings import FeatureStoreSettings
    from serving.app import create_app
    from serving.settings import ServingSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    overrides = {k: v for k, v in {"bundle_dir": bundle, "host": host, "port": port}.items() if v is not None}
    settings = ServingSettings(**overrides)
    app = create_app(settings, FeatureStoreSettings())
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
