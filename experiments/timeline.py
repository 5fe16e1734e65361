"""The effect over time the results page draws: the guardrail's snapshots (experiments.state keeps them,
bounded) at a resolution fit for the experiment's span, each with every treatment's cumulative relative
effect and its always-valid band as of then.

A day or more of data: one point a day; an hour or more: one an hour; less: every snapshot. The point of
each period is its last snapshot (the cumulative counts at its end); the latest snapshot always ends the
series, so the last point is the experiment as it stands.
"""

from __future__ import annotations

import time

from dinrec.experiments.stats import VariantSums, compare

DAY_S, HOUR_S = 86_400.0, 3_600.0


def resolution(snapshots: list[dict]) -> tuple[str, float | None]:
    """("day", 86400), ("hour", 3600) or ("snapshot", None) for the span the snapshots cover."""
    span = snapshots[-1]["t"] - snapshots[0]["t"] if snapshots else 0.0
    if span >= 2 * DAY_S:
        return "day", DAY_S
    if span >= 2 * HOUR_S:
        return "hour", HOUR_S
    return "snapshot", None


def _periods(snapshots: list[dict], period: float | None) -> list[dict]:
    if period is None:
        return list(snapshots)
    last: dict[int, dict] = {}
    for s in snapshots:  # oldest first: each period's last one wins
        last[int(s["t"] // period)] = s
    return list(last.values())


def snapshot_sums(row: dict | None) -> VariantSums:
    """A variant's sums as a snapshot kept them (nobody yet: zeros; from before the squares were kept: the
    counts alone)."""
    if not row or "impressions_sq" not in row:  # nobody yet, or a snapshot from before sums were kept
        return VariantSums(int((row or {}).get("users", 0)), float((row or {}).get("impressions", 0)),
                           float((row or {}).get("clicks", 0)), 0.0, 0.0, 0.0)
    return VariantSums(**row)


def effect_over_time(snapshots: list[dict], control: str, treatments: list[str], *, alpha: float = 0.05,
                     tuning_users: float = 5000) -> dict:
    """{"resolution", "points": [{"t", "variants": {name: {users, impressions, clicks}}, "effects": {treatment:
    {lift, cs_low, cs_high}}}]} — the lift and band as they stood at each point (None before both arms have
    clicks to compare)."""
    name, period = resolution(snapshots)
    points = []
    for s in _periods(snapshots, period):
        sums = {v: snapshot_sums(row) for v, row in s.get("variants", {}).items()}
        base = sums.get(control, VariantSums(0, 0, 0, 0, 0, 0))
        effects = {}
        for t in treatments:
            r = compare(base, sums.get(t, VariantSums(0, 0, 0, 0, 0, 0)), t, alpha=alpha, tuning_users=tuning_users)
            nothing = r.lift != r.lift  # NaN: nothing to compare yet
            effects[t] = {k: None if nothing else round(getattr(r, k), 6) for k in ("lift", "cs_low", "cs_high")}
        counts = {v: {"users": x.users, "impressions": x.impressions, "clicks": x.clicks} for v, x in sums.items()}
        points.append({"t": s["t"], "variants": counts, "effects": effects})
    return {"resolution": name, "points": points}


def traffic_per_day(snapshots: list[dict], days: int = 14) -> list[dict]:
    """New users per variant on each UTC day of the last ``days`` (the users the day's last snapshot
    counts, less the day before's), oldest first: the traffic an SRM check's shares come from."""
    last: dict[int, dict] = {}
    for s in snapshots:
        last[int(s["t"] // DAY_S)] = s
    rows: list[dict] = []
    before: dict[str, int] = {}
    for day in sorted(last):
        users = {v: int(row.get("users", 0)) for v, row in last[day].get("variants", {}).items()}
        rows.append({"day": time.strftime("%Y-%m-%d", time.gmtime(day * DAY_S)),
                     "users": {v: n - before.get(v, 0) for v, n in users.items()}})
        before = users
    return rows[-days:]
