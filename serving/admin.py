"""Operator endpoints, off unless DINREC_ADMIN_TOKEN is set: which model serves, hot reload, rollback.

``POST /admin/reload`` and ``POST /admin/rollback`` act on the fleet: they move the registry alias
every replica and worker follows (by compare-and-swap: a move racing another is refused with 409),
after checking here that the version they move it to serves; this worker swaps at once, the others
within ``DINREC_RELOAD_POLL_S``. Without a registry there is no fleet-wide pointer, and they refuse.
``POST /admin/instance/reload`` and ``/admin/instance/rollback`` change this one worker process only
(pinned until the alias moves), and say so in their answer (``"scope": "instance"``).
"""

from __future__ import annotations

import logging
import secrets
from typing import Annotated

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from starlette.exceptions import HTTPException

from dinrec.registry.store import AliasConflict, Registry, RegistryError, S3Registry
from dinrec.serving.deps import Models, Settings
from dinrec.serving.models import ModelManager, ReloadFailed
from dinrec.serving.settings import ServingSettings
from dinrec.storage import outage

router = APIRouter(prefix="/admin", tags=["admin"])
# One line per change an operator made (which route, from where, what changed): kept apart, so it can
# be routed to an audit sink. The request id is on every line (serving.logs).
log = logging.getLogger(__name__)
audit_log = logging.getLogger("dinrec.audit")


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(None, description="serve this registry version (default: where the alias points)")
    expected: str | None = Field(None, description=(
        "fleet reload only: move the alias only if it still names this version (what the caller looked at)"))


class ModelStatus(BaseModel):
    model_version: str | None = Field(description="the model serving (null while waiting for the first)")
    version: str | None = Field(description="registry version (null when serving DINREC_BUNDLE_DIR)")
    alias: str | None
    previous: str | None = Field(description="model version kept for rollback")
    changed: bool = False
    held: str | None = Field(None, description=(
        "a version the alias names that does not serve (refused, or rolled back from): the watcher leaves it "
        "until the alias moves"))
    watch_checks: int = Field(0, description="how often the watcher has checked the alias (it is alive if this grows)")
    scope: str = Field("instance", description=(
        "what a change acted on: fleet (the alias every replica follows) or instance (this worker process)"))


def bearer(authorization: str | None, token: SecretStr | None) -> bool:
    """``Authorization: Bearer <token>``: the scheme (any case) and the credential read apart, the
    credential compared in constant time. False when no token is configured."""
    scheme, _, credential = (authorization or "").strip().partition(" ")
    credential = credential.strip()
    return bool(token is not None and scheme.lower() == "bearer" and credential
                and secrets.compare_digest(credential.encode("latin-1", "replace"),
                                           token.get_secret_value().encode("latin-1", "replace")))


def is_admin(settings: ServingSettings, authorization: str | None) -> bool:
    """``Authorization: Bearer <DINREC_ADMIN_TOKEN>`` (False when no token is configured)."""
    return bearer(authorization, settings.admin_token)


def _authorize(settings: ServingSettings, authorization: str | None) -> None:
    """The admin routes: 404 when no token is configured (they do not exist), 401 without the token."""
    if settings.admin_token is None:
        raise HTTPException(404, "admin endpoints are off: set DINREC_ADMIN_TOKEN")
    if not is_admin(settings, authorization):
        raise HTTPException(401, "a valid `Authorization: Bearer <DINREC_ADMIN_TOKEN>` header is required",
                            headers={"WWW-Authenticate": "Bearer"})


def audit(request: Request, action: str, **change) -> None:
    """Log an operator's change: the route, the client's address, what changed."""
    client = request.client.host if request.client else "-"
    audit_log.warning("admin %s %s from %s: %s", action, request.url.path, client,
                      " ".join(f"{k}={v!r}" for k, v in change.items()) or "-")


def _status(models: ModelManager, alias: str, changed: bool = False, scope: str = "instance") -> ModelStatus:
    previous = models.previous[1].model_version if models.previous else None
    return ModelStatus(model_version=models.model_version, version=models.version,
                       alias=alias if models.registry else None, previous=previous,
                       changed=changed, held=models.held, watch_checks=models.watch_checks, scope=scope)


Auth = Annotated[str | None, Header()]


@router.get("/model", response_model=ModelStatus)
def model(settings: Settings, models: Models, authorization: Auth = None) -> ModelStatus:
    _authorize(settings, authorization)
    return _status(models, settings.model_alias)


def _fleet(models: ModelManager) -> Registry | S3Registry:
    if models.registry is None:
        raise HTTPException(409, "no registry (DINREC_REGISTRY): there is no alias for the fleet to follow; "
                                 "/admin/instance/reload and /admin/instance/rollback change this worker only")
    return models.registry


@router.post("/reload", response_model=ModelStatus)
def reload(settings: Settings, models: Models, request: Request, body: ReloadRequest | None = None,
           authorization: Auth = None) -> ModelStatus:
    """Fleet-wide. With a ``version``: check it serves here (loaded, verified, smoke-scored), then move the
    alias to it — every replica follows; 409 and nothing moved if it cannot be served or the alias moved
    meanwhile (or is not at ``expected``), 503 if the alias could not be written (this worker then serves
    what the alias names, as the others do). Without one: serve where the alias points now, here at once."""
    _authorize(settings, authorization)
    alias = settings.model_alias
    registry = _fleet(models)
    before = models.model_version
    version, expected = (body.version, body.expected) if body else (None, None)
    if version is not None:
        try:
            current = registry.resolve(alias)
        except RegistryError as exc:
            audit(request, "reload failed", version=version, reason=str(exc), serving=before)
            raise HTTPException(503, f"the registry cannot be read: {exc}") from exc
        _serve_then_move(models, alias, request, "reload", version, expected or current, "admin reload")
        changed = True
    else:
        try:
            changed = models.reload()
        except ReloadFailed as exc:
            audit(request, "reload refused", version=None, reason=str(exc))
            raise HTTPException(409, str(exc)) from exc
    status = _status(models, alias, changed, scope="fleet")
    audit(request, "reload", alias=alias, asked=version, before=before, now=status.model_version)
    return status


@router.post("/rollback", response_model=ModelStatus)
def rollback(settings: Settings, models: Models, request: Request, authorization: Auth = None) -> ModelStatus:
    """Fleet-wide: the version the alias held before is checked to serve here first, then the alias moves
    back to it (a recorded move, by compare-and-swap); every replica follows. 409 and nothing moved if there
    is none, it cannot serve, or the alias raced; 503 if the alias could not be written."""
    _authorize(settings, authorization)
    alias = settings.model_alias
    registry = _fleet(models)
    before = models.model_version
    try:
        current, back = registry.rollback_target(alias)
    except RegistryError as exc:  # nothing to go back to (409), or the registry cannot be read (503)
        audit(request, "rollback refused", reason=str(exc))
        raise HTTPException(503 if outage(exc) else 409, str(exc)) from exc
    _serve_then_move(models, alias, request, "rollback", back, current, f"rollback from {current}")
    status = _status(models, alias, changed=True, scope="fleet")
    audit(request, "rollback", alias=alias, version=back, before=before, now=status.model_version)
    return status


def _serve_then_move(models: ModelManager, alias: str, request: Request, action: str, version: str,
                     expected: str | None, reason: str) -> None:
    """Serve ``version`` here (what cannot serve is refused before anything moves), then move the alias to
    it by compare-and-swap from ``expected``, then follow the alias again (nothing pinned). If the alias
    does not move, this worker goes back to what the alias names — never a worker serving a version the
    alias does not name, nor an alias naming one nobody serves — and the request fails: 409 for a race,
    503 for a registry that could not be written. Every outcome leaves an audit line."""
    registry = _fleet(models)
    try:
        models.reload(version)
    except ReloadFailed as exc:
        audit(request, f"{action} refused", version=version, reason=str(exc))
        raise HTTPException(409, str(exc)) from exc
    try:
        registry.set_alias(alias, version, reason=reason, expected=expected)
    except Exception as exc:  # noqa: BLE001 - whatever kept the alias where it was, serve where it is
        serving = _serve_the_alias(models)
        audit(request, f"{action} failed", version=version, reason=str(exc), serving=serving)
        if isinstance(exc, AliasConflict):
            raise HTTPException(409, str(exc)) from exc
        raise HTTPException(503, f"the alias {alias!r} could not be moved to {version}: {exc}; serving what it "
                                 f"names ({serving})") from exc
    models.reload()  # the alias names it now: follow the alias, nothing held back


def _serve_the_alias(models) -> str:
    """Serve what the alias names again (after a move that did not happen); the model version served."""
    try:
        models.reload()
    except Exception:  # noqa: BLE001 - the registry unreadable too: say so; the watcher retries
        log.exception("could not go back to the alias' version; serving %s until the watcher can",
                      models.model_version)
    return models.model_version


@router.post("/instance/reload", response_model=ModelStatus)
def reload_instance(settings: Settings, models: Models, request: Request, body: ReloadRequest | None = None,
                    authorization: Auth = None) -> ModelStatus:
    """This worker process only: load the alias' (or the given) version, smoke-score it and swap it in
    (a given version stays pinned until the alias moves); 409 (still serving the old one) if it cannot."""
    _authorize(settings, authorization)
    before = models.model_version
    try:
        changed = models.reload(body.version if body else None)
    except ReloadFailed as exc:
        audit(request, "instance reload refused", version=body.version if body else None, reason=str(exc))
        raise HTTPException(409, str(exc)) from exc
    status = _status(models, settings.model_alias, changed)
    audit(request, "instance reload", asked=body.version if body else None, before=before, now=status.model_version)
    return status


@router.post("/instance/rollback", response_model=ModelStatus)
def rollback_instance(settings: Settings, models: Models, request: Request, authorization: Auth = None) -> ModelStatus:
    """This worker process only: swap back to the model it served before (held until the alias moves)."""
    _authorize(settings, authorization)
    before = models.model_version
    try:
        models.rollback()
    except ReloadFailed as exc:
        raise HTTPException(409, str(exc)) from exc
    status = _status(models, settings.model_alias, changed=True)
    audit(request, "instance rollback", before=before, now=status.model_version)
    return status
