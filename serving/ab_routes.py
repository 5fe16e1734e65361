"""Read-only A/B endpoints: the experiments running and their results (what the dashboard shows)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException

from experiments.stats import VariantSums, analyse, intersect, verdict
from serving.deps import State

router = APIRouter()
_DASHBOARD = Path(__file__).with_name("static") / "dashboard.html"


@router.get("/dashboard", include_in_schema=False)
def dashboard() -> HTMLResponse:
    """The A/B dashboard: one self-contained page (no CDN) that reads the two endpoints below."""
    return HTMLResponse(_DASHBOARD.read_text(encoding="utf-8"))


# The seed is left out: with it anyone could compute which arm any user id lands in.
_NOT_PUBLIC = {"seed"}


@router.get("/experiments")
def list_experiments(state: State) -> dict:
    return {"experiments": [e.model_dump(mode="json", exclude=_NOT_PUBLIC) for e in state.experiments.all]}


@router.get("/experiments/{name}/results")
def experiment_results(state: State, name: str) -> dict:
    """Per variant users, impressions, clicks and CTR (delta-method se); per treatment the lift
    against control with a fixed-horizon CI and p-value and the always-valid confidence sequence;
    the sample-ratio check; clicks that could not be attributed; stopped variants, the ramp steps
    reached, a promoted winner, or one proposed for an operator to approve (the guardrail's decisions)."""
    exp = state.experiments.get(name)
    if exp is None:
        raise HTTPException(404, f"no experiment {name!r}")
    counted = state.experiment_state.sums(name)  # StoreUnavailable → 503 in the one error shape
    empty = VariantSums(0, 0, 0, 0, 0, 0)  # a variant nobody has seen yet still gets its row
    sums = {v.name: counted.get(v.name, empty) for v in exp.variants}
    results = analyse(sums, exp.control_name, exp.weights)
    stopped, winner = state.experiment_state.stopped(name), state.experiment_state.conclusion(name)
    decided = {**stopped, **({winner["variant"]: winner} if winner else {})}
    for row in results["comparisons"]:  # a decision once reached stands: its sequence is intersected in
        d = decided.get(row["variant"])
        if d is not None and row["cs_low"] is not None and d.get("cs_low") is not None:
            row["cs_low"], row["cs_high"] = intersect((d["cs_low"], d["cs_high"]), row["cs_low"], row["cs_high"])
            row["sequential"] = verdict(row["cs_low"], row["cs_high"])
    held = state.guardrail.held(name) if state.guardrail is not None else []
    return {"experiment": exp.model_dump(mode="json", exclude=_NOT_PUBLIC), "results": results,
            "stopped": stopped, "unattributed": state.experiment_state.unattributed(),
            "ramp": state.experiment_state.ramp_log(name) if exp.ramp else None,
            "winner": winner, "proposed": None if winner else state.experiment_state.proposal(name),
            "held": held, "timeline": state.experiment_state.timeline(name)}
