"""Experiments by API (token-protected, like the other /admin endpoints) and by file.

``DINREC_EXPERIMENTS_FILE`` is the versioned source of truth: ``PUT /admin/experiments/{name}`` and
``POST /admin/experiments/{name}/status`` rewrite it (the next version, atomically) and apply it;
every replica watches the file and applies a new version within ``DINREC_RELOAD_POLL_S``. A change
that does not validate — or names a model that cannot be loaded — is refused and nothing is written.
Assignment is a pure function of (seed, user), so replicas agree as soon as they hold the same file.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from experiments.running import Experiments
from experiments.spec import Experiment, ExperimentFile
from serving.admin import _authorize, audit
from serving.deps import ServiceState, State
from serving.loops import every

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", tags=["admin"])
_write_lock = threading.Lock()  # one writer per process; replicas sharing a file: the last write wins


class StatusChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["draft", "running", "stopped"]


def apply(state: ServiceState, new: Experiments) -> None:
    """Serve ``new``: load the models its variants name first (raises if one cannot be), then swap."""
    if state.models is not None:
        state.models.load_variants(new.models() - set(state.models.variants))
    state.experiments = new
    if state.guardrail is not None:
        state.guardrail.experiments = new


def _update(state: ServiceState, change) -> dict:
    path = state.settings.experiments_file
    if path is None:
        raise HTTPException(409, "no DINREC_EXPERIMENTS_FILE to keep experiments in")
    with _write_lock:
        current = Experiments.load(path)
        try:
            candidate = ExperimentFile(version=current.version, experiments=change(list(current.all)))
            if state.models is not None:
                state.models.load_variants(Experiments(candidate.experiments).models() - set(state.models.variants))
        except (ValueError, RuntimeError) as exc:
            raise HTTPException(409, f"refused, nothing changed: {exc}") from exc
        saved = candidate.save(path)
        apply(state, Experiments.load(path))
    return {"version": saved.version, "experiments": [e.name for e in saved.experiments]}


@router.put("/experiments/{name}")
def put_experiment(state: State, request: Request, name: str, body: Experiment,
                   authorization: Annotated[str | None, Header()] = None) -> dict:
    """Create or replace one experiment."""
    _authorize(state, authorization)
    if body.name != name:
        raise HTTPException(409, f"the body names experiment {body.name!r}, the path {name!r}")
    saved = _update(state, lambda exps: [e for e in exps if e.name != name] + [body])
    audit(request, "experiment put", experiment=name, status=body.status, version=saved["version"],
          variants=[v.name for v in body.variants])
    return saved


@router.post("/experiments/{name}/status")
def set_status(state: State, request: Request, name: str, body: StatusChange,
               authorization: Annotated[str | None, Header()] = None) -> dict:
    """Start (running), pause (draft) or end (stopped) an experiment."""
    _authorize(state, authorization)

    def change(exps: list[Experiment]) -> list[Experiment]:
        if name not in {e.name for e in exps}:
            raise HTTPException(404, f"no experiment {name!r}")
        return [e.model_copy(update={"status": body.status}) if e.name == name else e for e in exps]

    saved = _update(state, change)
    audit(request, "experiment status", experiment=name, status=body.status, version=saved["version"])
    return saved


def watch_file(state: ServiceState, stop: threading.Event) -> threading.Thread | None:
    """Apply the experiments file whenever it changes on disk (another replica, an operator's edit)."""
    path = state.settings.experiments_file
    if path is None:
        return None
    failed_mtime: list[int | None] = [None]

    def poll() -> None:
        mtime = None
        try:
            if not path.exists():  # not written yet (the admin API creates it)
                return
            mtime = path.stat().st_mtime_ns
            if mtime in (state.experiments.mtime_ns, failed_mtime[0]):
                return
            with _write_lock:
                apply(state, Experiments.load(path))
            log.info("experiments file %s: now serving version %d", path, state.experiments.version)
        except Exception as exc:  # noqa: BLE001 - a bad file: the old set serves until the file changes
            failed_mtime[0] = mtime
            log.error("experiments file %s not applied; keeping version %d: %s", path,
                      state.experiments.version, exc)

    return every(state.settings.reload_poll_s, stop, poll, name="dinrec-experiments-watch")
