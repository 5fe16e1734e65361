"""A real uvicorn server on a free loopback port, so API tests go through HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import httpx
import pytest
import torch
from pydantic import SecretStr

from dinrec.models.bundle import load_bundle
from dinrec.registry.store import Registry
from dinrec.serving.app import create_app
from dinrec.serving.deps import ServiceState
from dinrec.serving.liveness import LoopHeartbeat
from dinrec.serving.server import free_port, serve_in_thread
from dinrec.training.export import export_bundle
from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN


class ServiceClient(httpx.Client):
    """A client of a service in this process, which can reach into it."""

    service_state: Callable[[], ServiceState]  # the state its lifespan built
    app_liveness: Callable[[], LoopHeartbeat]  # its event loop's heartbeat (with a health_port)


@contextlib.contextmanager
def live_server(settings, fs_settings=None, *, operator: bool = False, **deps):
    """An httpx client of the service; ``client.service_state()`` is the state its lifespan built.
    ``operator``: the client sends the admin token (``settings`` must hold it), so its answers carry the
    operator's fields (the arm, the model, the strategy: serving.schemas.RecommendResponse)."""
    if operator and settings.admin_token is None:
        settings = settings.model_copy(update={"admin_token": SecretStr(ADMIN_TOKEN)})
    port = free_port()
    app = create_app(settings, fs_settings, **deps)
    with serve_in_thread(app, port, start_timeout_s=30), \
            ServiceClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers=ADMIN_HEADERS if operator else None) as client:
        client.service_state = lambda: app.state.dinrec
        client.app_liveness = lambda: app.state.liveness
        yield client


@pytest.fixture
def registry(tiny_run, tmp_path):
    """A local registry with two versions of the tiny model (v2 perturbed); champion -> v1."""
    _, samples, bundle_dir, metrics = tiny_run
    reg = Registry(tmp_path / "registry")
    reg.publish(bundle_dir, "v1")
    v1 = load_bundle(bundle_dir)
    assert v1.covisit is not None  # trained with towers: the bundle has its lane, which v2 keeps
    model = v1.model
    with torch.no_grad():  # a different model: its scores and version differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    reg.publish(export_bundle(tmp_path / "v2-build", model, samples, metrics, towers=v1.towers,
                                     lane=(v1.covisit, {})), "v2")
    reg.set_alias("champion", "v1")
    return reg
