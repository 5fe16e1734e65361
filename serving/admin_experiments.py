"""Experiments by API (token-protected, like the other /admin endpoints) and by document.

The experiments document (experiments.document, ``DINREC_EXPERIMENTS_FILE``: a file or an S3 object)
is the versioned source of truth: ``PUT /admin/experiments/{name}`` and ``POST
/admin/experiments/{name}/status`` write its next version by compare-and-swap and apply it; every
replica polls it and applies a new version within ``DINREC_RELOAD_POLL_S``. A change made while
another replica (or the retrain job) wrote is refused with 409 and the version now, and nothing is
written: the client reads and retries, and neither change is lost. A client may send ``If-Match:
<version>`` to have its change refused unless the document is still at the version it read. A change
that does not validate — or names a model that cannot be loaded — is refused and nothing is written.
Assignment is a pure function of (seed, user), so replicas agree as soon as they hold the same version.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from dinrec.experiments.document import DocumentConflict, ExperimentsDocument
from dinrec.experiments.guardrail import Guardrail
from dinrec.experiments.running import Experiments
from dinrec.experiments.spec import Experiment, ExperimentFile
from dinrec.serving.ab_routes import results_document
from dinrec.serving.admin import _authorize, audit
from dinrec.serving.deps import Counters, Documents, Models, Running, Settings
from dinrec.serving.models import ModelManager
from dinrec.storage.loops import every

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", tags=["admin"])
_apply_lock = threading.Lock()  # one swap at a time in this process (a request's and the poller's)


class StatusChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["draft", "running", "stopped"]


def apply(models: ModelManager, guardrail: Guardrail, new: Experiments) -> None:
    """Serve ``new``: load the models its variants name first (raises if one cannot be), then swap."""
    models.load_variants(new.models() - set(models.variants))
    guardrail.experiments = new  # what assigns users: the one place the running set lives


def _expected_version(if_match: str | None) -> int | None:
    if if_match is None:
        return None
    try:
        return int(if_match.strip().strip('"'))
    except ValueError:
        raise HTTPException(400, "If-Match: the experiments document version the change was made against "
                                 "(an integer)") from None


def _update(doc: ExperimentsDocument | None, models: ModelManager, guardrail: Guardrail, change,
            if_match: str | None) -> dict:
    if doc is None:
        raise HTTPException(409, "no DINREC_EXPERIMENTS_FILE to keep experiments in")

    def checked(exps: list[Experiment]) -> list[Experiment]:
        new = change(exps)  # may raise HTTPException (404): nothing written
        try:
            # every model a variant names loads here, or nothing is written
            models.load_variants(Experiments(new).models() - set(models.variants))
        except (ValueError, RuntimeError) as exc:
            raise HTTPException(409, f"refused, nothing changed: {exc}") from exc
        return new

    try:
        saved = doc.update(checked, expected=_expected_version(if_match))
    except DocumentConflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except ValueError as exc:  # the new experiments do not validate together (names, …)
        raise HTTPException(409, f"refused, nothing changed: {exc}") from exc
    with _apply_lock:
        if saved.version > guardrail.experiments.version:
            apply(models, guardrail, Experiments.of(saved))
    return {"version": saved.version, "experiments": [e.name for e in saved.experiments]}


@router.put("/experiments/{name}")
def put_experiment(settings: Settings, doc: Documents, models: Models, running: Running, request: Request, name: str,
                   body: Experiment,
                   authorization: Annotated[str | None, Header()] = None,
                   if_match: Annotated[str | None, Header()] = None) -> dict:
    """Create or replace one experiment (``If-Match``: only if the document is still at that version)."""
    _authorize(settings, authorization)
    if body.name != name:
        raise HTTPException(409, f"the body names experiment {body.name!r}, the path {name!r}")
    saved = _update(doc, models, running, lambda exps: [e for e in exps if e.name != name] + [body], if_match)
    audit(request, "experiment put", experiment=name, status=body.status, version=saved["version"],
          variants=[v.name for v in body.variants])
    return saved


@router.post("/experiments/{name}/status")
def set_status(settings: Settings, doc: Documents, models: Models, running: Running, counters: Counters,
               request: Request, name: str, body: StatusChange,
               authorization: Annotated[str | None, Header()] = None,
               if_match: Annotated[str | None, Header()] = None) -> dict:
    """Start (running), pause (draft) or end (stopped) an experiment."""
    _authorize(settings, authorization)

    now = datetime.now(UTC)

    def change(exps: list[Experiment]) -> list[Experiment]:
        if name not in {e.name for e in exps}:
            raise HTTPException(404, f"no experiment {name!r}")
        return [e.model_copy(update=_dated(e, body.status, now)) if e.name == name else e for e in exps]

    saved = _update(doc, models, running, change, if_match)
    exp = running.experiments.get(name)
    if body.status == "stopped" and exp is not None and exp.status == "stopped":
        # Its final results, kept: what its results call shows from now on (first stop's stand).
        counters.freeze(name, {**results_document(counters, running, models, exp), "frozen_at": now.timestamp()})
    audit(request, "experiment status", experiment=name, status=body.status, version=saved["version"])
    return saved


def _dated(exp: Experiment, status: str, now: datetime) -> dict:
    """The status change, with the experiment's first start and its stop dated (unless set already)."""
    update: dict = {"status": status}
    if status == "running" and exp.start is None:
        update["start"] = now
    if status == "stopped" and exp.stop is None:
        update["stop"] = now
    return update


@router.post("/experiments/{name}/approve")
def approve_winner(settings: Settings, running: Running, request: Request, name: str,
                   authorization: Annotated[str | None, Header()] = None) -> dict:
    """Promote the winner the guardrail proposed for ``name`` (where users are not verified, a winner
    waits for this): the alias moves to its model and every replica follows. 404 when none is proposed."""
    _authorize(settings, authorization)
    try:
        decision = running.approve(name)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from exc
    audit(request, "experiment approve", experiment=name, variant=decision["variant"], model=decision["model"],
          alias=decision["alias"], version=decision.get("version"))
    return decision


def watch_document(doc: ExperimentsDocument | None, models: ModelManager, guardrail: Guardrail, poll_s: float,
                   stop: threading.Event) -> threading.Thread | None:
    """Apply the experiments document whenever a newer version is written (another replica, the retrain
    job, an operator)."""
    if doc is None:
        return None
    failed: list[str | None] = [None]  # the storage version last refused: logged once, not every poll

    def poll() -> None:
        token = None
        try:
            found = doc.storage.get_versioned(doc.key)
            if found is None:  # not written yet (the admin API creates it)
                return
            token = found.version
            if token == failed[0]:
                return
            new = ExperimentFile.parse(found.data, doc.uri)
            with _apply_lock:
                if new.version == guardrail.experiments.version:
                    return
                apply(models, guardrail, Experiments.of(new))
            log.info("experiments document %s: now serving version %d", doc.uri,
                     guardrail.experiments.version)
        except Exception as exc:  # noqa: BLE001 - a bad document: the old set serves until it changes
            failed[0] = token
            log.error("experiments document %s not applied; keeping version %d: %s", doc.uri,
                      guardrail.experiments.version, exc)

    return every(poll_s, stop, poll, name="dinrec-experiments-watch")
