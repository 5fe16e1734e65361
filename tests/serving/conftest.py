"""A real uvicorn server on a free loopback port, so API tests go through HTTP."""

from __future__ import annotations

import contextlib

import httpx

from serving.app import create_app
from serving.server import free_port, serve_in_thread


@contextlib.contextmanager
def live_server(settings, fs_settings=None, **deps):
    port = free_port()
    with serve_in_thread(create_app(settings, fs_settings, **deps), port, start_timeout_s=30), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        yield client
