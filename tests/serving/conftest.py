"""A real uvicorn server on a free loopback port, so API tests go through HTTP."""

from __future__ import annotations

import contextlib

import httpx

from serving.app import create_app
from serving.server import free_port, serve_in_thread


@contextlib.contextmanager
def live_server(settings, fs_settings=None, **deps):
    """An httpx client of the service; ``client.service_state()`` is the state its lifespan built."""
    port = free_port()
    app = create_app(settings, fs_settings, **deps)
    with serve_in_thread(app, port, start_timeout_s=30), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        client.service_state = lambda: app.state.dinrec
        yield client
