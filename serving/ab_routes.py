"""Read-only A/B endpoints: the experiments running and their results (what the dashboard shows)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException

from dinrec.events.features import SEGMENTS
from dinrec.experiments.guardrail import Guardrail
from dinrec.experiments.metrics import METRICS, analyse_metric
from dinrec.experiments.power import plan, still_needed
from dinrec.experiments.served import summary as served_summary
from dinrec.experiments.spec import Experiment
from dinrec.experiments.state import ExperimentState
from dinrec.experiments.stats import VariantSums, analyse, intersect, verdict
from dinrec.experiments.timeline import effect_over_time, snapshot_sums, traffic_per_day
from dinrec.serving.admin import bearer, is_admin
from dinrec.serving.deps import Counters, Models, Running, Settings
from dinrec.serving.errors import InvalidRequest
from dinrec.serving.models import ModelManager, NoModelYet
from dinrec.serving.settings import is_loopback

router = APIRouter()


def _reader(settings: Settings, authorization: Annotated[str | None, Header()] = None) -> None:
    """The results' read token (DINREC_RESULTS_TOKEN, or the admin token) where the service listens beyond
    loopback and one is set: 401 without it. Bound to loopback only this machine reaches the service."""
    token = settings.results_token
    if token is None or is_loopback(settings.host):
        return
    if not (bearer(authorization, token) or is_admin(settings, authorization)):
        raise HTTPException(401, "a valid `Authorization: Bearer <DINREC_RESULTS_TOKEN>` header is required "
                                 "(the dashboard: open /dashboard#token=<token>)",
                            headers={"WWW-Authenticate": "Bearer"})


Reader = Depends(_reader)
_DASHBOARD = Path(__file__).with_name("static") / "dashboard.html"


@router.get("/dashboard", include_in_schema=False)
def dashboard() -> HTMLResponse:
    """The A/B dashboard: one self-contained page (no CDN) that reads the two endpoints below."""
    return HTMLResponse(_DASHBOARD.read_text(encoding="utf-8"))


# The seed is left out: with it anyone could compute which arm any user id lands in.
_NOT_PUBLIC = {"seed"}


@router.get("/experiments", dependencies=[Reader])
def list_experiments(running: Running) -> dict:
    return {"experiments": [e.model_dump(mode="json", exclude=_NOT_PUBLIC) for e in running.experiments.all]}


@router.get("/experiments/{name}/results", dependencies=[Reader])
def experiment_results(
    running: Running, counters: Counters, models: Models, name: str,
    since: Annotated[float | None, Query(ge=0, description=(
        "also the stored snapshots after this time (seconds since the epoch), oldest first"))] = None,
    limit: Annotated[int, Query(ge=1, le=5000, description="at most this many of them")] = 500,
) -> dict:
    """Per variant users, impressions, clicks and CTR (delta-method se); per treatment the CTR lift
    against control with a fixed-horizon CI and p-value and the always-valid confidence sequence; each of
    the experiment's metrics (``metrics``: its role, and per variant and treatment the same figures,
    CUPED-adjusted where the pre-exposure covariate applies — what the guardrail acts on);
    the sample-ratio check; clicks that could not be attributed; stopped variants, the ramp steps
    reached, a promoted winner, or one proposed for an operator to approve (the guardrail's decisions);
    the effect over time (a point a day, an hour or a snapshot, by the span); with ``since``, a page of the
    stored snapshots and where the next page starts. A stopped experiment: the results it stopped with
    (``frozen_at`` says when)."""
    exp = running.experiments.get(name)
    if exp is None:
        raise HTTPException(404, f"no experiment {name!r}")
    # A stopped experiment shows the results it stopped with (kept by the status change), not its counters.
    frozen = counters.frozen(name) if exp.status == "stopped" else None
    out = dict(frozen) if frozen else results_document(counters, running, models, exp)
    if since is not None:  # a page of the stored snapshots
        after = [s for s in counters.timeline(name) if s["t"] > since]
        out["snapshots"] = after[:limit]
        out["next_since"] = after[limit - 1]["t"] if len(after) > limit else None
    return out


def results_document(counters: ExperimentState, guardrail: Guardrail, models: ModelManager, exp: Experiment) -> dict:
    """The results of ``exp`` from its counters and the guardrail's records, as the results call shows them."""
    name = exp.name
    counted = counters.sums(name)  # StoreUnavailable → 503 in the one error shape
    sums = {v.name: counted.get(v.name, VariantSums.empty()) for v in exp.variants}  # nobody seen yet: still a row
    results = analyse(sums, exp.control_name, exp.weights)
    stopped, winner = counters.stopped(name), counters.conclusion(name)
    decided = {**stopped, **({winner["variant"]: winner} if winner else {})}
    snapshots = counters.timeline(name)
    as_stopped = _as_stopped(snapshots, stopped, exp.control_name)
    results["metrics"] = {
        use.name: {"role": use.role, "direction": use.direction,
                   **analyse_metric(METRICS[use.name], sums, exp.control_name, alpha=results["alpha"],
                                    higher_is_better=use.direction == "higher", as_stopped=as_stopped)}
        for use in exp.metrics}
    results["breakdown"] = _breakdown(counters, exp, sums, stopped, results["alpha"])
    results["served"] = {v: served_summary(counts, distinct, _catalog_size(models)) for v, (counts, distinct)
                         in counters.served(name, list(sums)).items()}
    for metric, rows, higher in [("ctr", results["comparisons"], True)] + [
            (m, r["comparisons"], r["direction"] == "higher") for m, r in results["metrics"].items()]:
        for row in rows:  # a decision once reached stands: its sequence is intersected in
            d = decided.get(row["variant"])
            if d is not None and d.get("metric", "ctr") == metric and row["cs_low"] is not None \
                    and d.get("cs_low") is not None:
                row["cs_low"], row["cs_high"] = intersect((d["cs_low"], d["cs_high"]), row["cs_low"],
                                                          row["cs_high"])
                row["sequential"] = verdict(row["cs_low"], row["cs_high"], higher_is_better=higher)
    held = guardrail.held(name)
    users = {v: s.users for v, s in sums.items()}
    results["power"] = still_needed(results["comparisons"], users, exp.control_name, exp.mde,
                                    _users_per_day(snapshots, exp, sum(users.values())), stopped=stopped)
    results["srm"]["traffic_per_day"] = traffic_per_day(snapshots)
    over_time = effect_over_time(snapshots, exp.control_name,
                                 [v.name for v in exp.variants if v.name != exp.control_name])
    return {"experiment": exp.model_dump(mode="json", exclude=_NOT_PUBLIC), "results": results,
            "stopped": stopped, "unattributed": counters.unattributed(),
            "ramp": counters.ramp_log(name) if exp.ramp else None,
            "winner": winner, "proposed": None if winner else counters.proposal(name),
            "held": held, "timeline": over_time["points"], "timeline_resolution": over_time["resolution"],
            "frozen_at": None}


def _catalog_size(models: ModelManager) -> int | None:
    """The items the serving model knows (what coverage is a share of); None while no model serves."""
    try:
        return len(models.serving_or_raise().bundle.vocab.items)
    except NoModelYet:
        return None


def _breakdown(counters: ExperimentState, exp: Experiment, sums: dict[str, VariantSums], stopped: dict,
               alpha: float) -> dict:
    """Each declared metric per segment of users (by their behaviours before their first exposure), the arms
    still running only (a stopped arm's users go on converting under the default experience). Exploratory:
    nothing acts on it, and its many comparisons are not corrected for."""
    by_segment = counters.segments(exp.name)
    running = [v for v in sums if v not in stopped]
    out = []
    for segment, least in SEGMENTS:
        counted = by_segment.get(segment, {})
        arms = {v: counted.get(v, VariantSums.empty()) for v in running}
        out.append({"segment": segment, "least_behaviours": least, "users": {v: s.users for v, s in arms.items()},
                    "metrics": {use.name: analyse_metric(METRICS[use.name], arms, exp.control_name, alpha=alpha,
                                                         higher_is_better=use.direction == "higher")
                                for use in exp.metrics} if exp.control_name in arms else {}})
    return {"dimension": "behaviours before the first exposure", "exploratory": True, "segments": out}


def _as_stopped(snapshots: list[dict], stopped: dict[str, dict], control: str) -> dict:
    """By stopped variant: (when, control's sums, its sums) in the guardrail's last snapshot before the stop
    (the check that stopped it took one first); a variant stopped before any snapshot is left out."""
    out = {}
    for variant, decision in stopped.items():
        before = [s for s in snapshots if s["t"] <= decision.get("at", 0.0) and variant in s.get("variants", {})]
        if before:
            snap = before[-1]
            out[variant] = (snap["t"], snapshot_sums(snap["variants"].get(control)),
                            snapshot_sums(snap["variants"][variant]))
    return out


def _users_per_day(timeline: list[dict], exp, users_now: int) -> float | None:
    """New users a day: over the guardrail's snapshots, else since the experiment's start (None: unknown)."""
    if len(timeline) >= 2:
        first, last = timeline[0], timeline[-1]
        span = last["t"] - first["t"]
        grown = sum(v["users"] for v in last["variants"].values()) - sum(v["users"] for v in first["variants"].values())
        if span > 0:
            return round(grown / span * 86_400, 1)
    if exp.start is not None:
        span = time.time() - exp.start.timestamp()
        if span > 0:
            return round(users_now / span * 86_400, 1)
    return None


@router.get("/experiments/plan")
def plan_experiment(
    mean: Annotated[float, Query(ge=1e-9, le=1e9, description="the metric's mean per user (or CTR)")],
    sd: Annotated[float, Query(ge=1e-9, le=1e9, description="its standard deviation over users (a CTR's: the "
                                                            "results' ctr_se × √users)")],
    users_per_day: Annotated[float, Query(ge=1, le=1e9)],
    effect: Annotated[float, Query(ge=1e-6, le=10, description="the relative lift to find (0.05 = +5 %)")] = 0.05,
    variations: Annotated[int, Query(ge=2, le=20)] = 2,
    alpha: Annotated[float, Query(ge=1e-6, lt=0.5)] = 0.05,
    days: Annotated[int, Query(ge=1, le=365)] = 28,
    sequential: bool = True,
    tuning: Annotated[float, Query(ge=1, le=1e9, description="where the sequential interval is tightest, in "
                                                              "users")] = 5000,
) -> dict:
    """The power calculator (GrowthBook's formulas): day by day the power for ``effect`` and the smallest lift
    found with 80 % power, and the first day ``effect`` reaches it. Inputs whose figures leave the range of
    a float (a mean of 1e-9 with a standard deviation of 1e9, …) get 422, not a number that is not one."""
    try:
        planned = plan(mean, sd**2, effect, users_per_day, days=days, variations=variations, alpha=alpha,
                       sequential_tuning=tuning if sequential else None)
    except (ArithmeticError, ValueError) as exc:
        raise InvalidRequest(f"no plan for these inputs: {exc}") from exc
    finite = [planned["users_needed"] or 0.0] + [x for d in planned["days"] for x in (d["power"], d["mde"] or 0.0)]
    if not all(math.isfinite(x) for x in finite):
        raise InvalidRequest("no plan for these inputs: its figures leave the range of a float")
    return planned
