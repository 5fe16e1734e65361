"""The effect over time: a point a day, an hour or a snapshot by the span, each the cumulative effect then."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from dinrec.experiments.stats import VariantSums, compare
from dinrec.experiments.timeline import effect_over_time, resolution


def _snapshots(hours: float, every_s: float, seed: int = 0) -> list[dict]:
    """An experiment growing steadily: cumulative per-user sums of two arms, one snapshot every ``every_s``."""
    rng = np.random.default_rng(seed)
    per_user: dict[str, list[tuple[float, float]]] = {"control": [], "t": []}
    out = []
    for k in range(int(hours * 3600 / every_s)):
        for arm, ctr in (("control", 0.05), ("t", 0.06)):
            n = 1 + rng.poisson(8, 20)
            per_user[arm] += list(zip(n.astype(float), rng.binomial(n, ctr).astype(float), strict=True))
        out.append({"t": 1.7e9 + k * every_s,
                    "variants": {arm: asdict(VariantSums.of(rows)) for arm, rows in per_user.items()}})
    return out


def test_the_resolution_follows_the_span():
    assert resolution(_snapshots(72, 1800))[0] == "day"
    assert resolution(_snapshots(5, 600))[0] == "hour"
    assert resolution(_snapshots(0.5, 60))[0] == "snapshot" and resolution([])[0] == "snapshot"


def test_each_point_is_its_period_s_last_snapshot_with_the_effect_as_it_stood():
    snaps = _snapshots(72, 1800)
    view = effect_over_time(snaps, "control", ["t"])
    days = {int(s["t"] // 86_400) for s in snaps}
    assert view["resolution"] == "day" and len(view["points"]) == len(days)
    assert view["points"][-1]["t"] == snaps[-1]["t"]  # the series ends with the experiment as it stands
    for point in view["points"]:
        snap = next(s for s in snaps if s["t"] == point["t"])
        assert all(s["t"] // 86_400 != point["t"] // 86_400 or s["t"] <= point["t"] for s in snaps)
        want = compare(VariantSums(**snap["variants"]["control"]), VariantSums(**snap["variants"]["t"]), "t")
        got = point["effects"]["t"]
        assert got["lift"] == pytest.approx(want.lift, abs=1e-6)
        assert (got["cs_low"], got["cs_high"]) == pytest.approx((want.cs_low, want.cs_high), abs=1e-6)
    widths = [p["effects"]["t"]["cs_high"] - p["effects"]["t"]["cs_low"] for p in view["points"]]
    assert widths == sorted(widths, reverse=True)  # more users, a narrower band


def test_an_arm_with_nothing_yet_has_no_effect():
    view = effect_over_time([{"t": 1.0, "variants": {}}, {"t": 2.0, "variants": {"control": {"users": 1}}}],
                            "control", ["t"])
    assert [p["effects"]["t"]["lift"] for p in view["points"]] == [None, None]


def test_traffic_per_day_is_each_day_s_new_users():
    from dinrec.experiments.timeline import traffic_per_day

    snaps = _snapshots(72, 1800)  # 20 new users an arm every half hour
    rows = traffic_per_day(snaps)
    days = sorted({int(s["t"] // 86_400) for s in snaps})
    assert len(rows) == len(days) and rows[0]["day"] < rows[-1]["day"]
    assert sum(r["users"]["t"] for r in rows) == snaps[-1]["variants"]["t"]["users"]  # every user, once
    whole = [r for r, d in zip(rows, days, strict=True) if d not in (days[0], days[-1])]
    assert whole and all(r["users"]["control"] == 48 * 20 for r in whole)  # a whole day: 48 snapshots' worth
