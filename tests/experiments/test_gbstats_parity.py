"""dinrec's A/B statistics equal GrowthBook's (gbstats, tests/reference/gbstats, run in its own environment)
from the same per-variant sums: the relative lift, its standard error, the fixed-horizon interval and
p-value, the always-valid interval and p-value — for a per-user mean, a ratio (CTR), and both with CUPED.

Where gbstats answers nothing (a control mean of 0, an arm with no variance) dinrec answers otherwise on
purpose (tests/experiments/test_stats.py); the cases here are the ones both answer."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dinrec.experiments.stats import (
    CupedMeanStat,
    CupedRatioStat,
    MeanStat,
    Moments,
    RatioStat,
    Stat,
    relative_effect,
    with_theta,
)
from tests.conftest import REPO

REFERENCE = REPO / "tests" / "reference" / "gbstats"
GBSTATS_PYTHON_ENV = "DINREC_GBSTATS_PYTHON"
close = partial(pytest.approx, rel=1e-9, abs=1e-12)  # equal to gbstats' figures but for rounding


def _python() -> Path:
    """The reference environment's interpreter: DINREC_GBSTATS_PYTHON, else the one `make test` builds
    beside dinrec's (<venv>-gbstats)."""
    explicit = os.environ.get(GBSTATS_PYTHON_ENV)
    python = Path(explicit) if explicit else Path(f"{sys.prefix}-gbstats") / "bin" / "python"
    if not python.exists():
        msg = f"no gbstats environment at {python}: run `make test` (or set {GBSTATS_PYTHON_ENV})"
        if os.environ.get("DINREC_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return python


def _gbstats(cases: list[dict]) -> list[dict]:
    run = subprocess.run([str(_python()), str(REFERENCE / "reference.py")], input=json.dumps(cases), cwd=REFERENCE,
                         env={**os.environ, "PYTHONPATH": str(REFERENCE)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _m(x: np.ndarray) -> Moments:
    return Moments(len(x), float(x.sum()), float((x * x).sum()))


def _sums(x: np.ndarray) -> list[float]:
    return [float(x.sum()), float((x * x).sum())]


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float((x * y).sum())


def _arm(rng: np.random.Generator, kind: str, n: int, lift: float, shape: float = 2.0) -> tuple[Stat, dict]:
    """One arm's users, drawn from a world with a per-user propensity (mean 1; a smaller ``shape``, users
    differ more) that persists from the pre-period: (dinrec's statistic, the reference's sums)."""
    taste = rng.gamma(shape, 1 / shape, n)  # a user's propensity, shared by the pre- and post-period
    if kind in ("mean", "cuped_mean"):
        post = rng.poisson(taste * (1 + lift)) * rng.lognormal(0, 0.3, n)  # e.g. value per user
        pre = rng.poisson(taste).astype(float)
        if kind == "mean":
            return MeanStat(_m(post)), {"n": n, "x": _sums(post)}
        return (CupedMeanStat(_m(post), _m(pre), float((post * pre).sum())),
                {"n": n, "post": _sums(post), "pre": _sums(pre), "post_pre": float((post * pre).sum())})
    ctr = np.clip(0.03 * taste, 0, 0.9)
    d = (1 + rng.poisson(8, n)).astype(float)  # impressions
    m = rng.binomial(d.astype(int), np.clip(ctr * (1 + lift), 0, 1)).astype(float)  # clicks
    if kind == "ratio":
        return RatioStat(_m(m), _m(d), float((m * d).sum())), {"n": n, "m": _sums(m), "d": _sums(d),
                                                               "m_d": float((m * d).sum())}
    d_pre = (1 + rng.poisson(6, n)).astype(float)
    m_pre = rng.binomial(d_pre.astype(int), ctr).astype(float)
    products = (_dot(m, d), _dot(m, m_pre), _dot(m, d_pre), _dot(d, m_pre), _dot(d, d_pre), _dot(m_pre, d_pre))
    return (CupedRatioStat(_m(m), _m(d), _m(m_pre), _m(d_pre), products),
            {"n": n, "m": _sums(m), "d": _sums(d), "m_pre": _sums(m_pre), "d_pre": _sums(d_pre),
             "products": list(products)})


KINDS = ("mean", "ratio", "cuped_mean", "cuped_ratio")


def test_every_figure_equals_gbstats_from_the_same_sums():
    rng = np.random.default_rng(42)
    ours = []
    cases: list[dict[str, Any]] = []  # what the reference reads, as JSON
    for kind in KINDS:
        for n_a, n_b, lift, alpha, tuning in ((40, 35, 0.0, 0.05, 5000), (600, 650, 0.1, 0.05, 5000),
                                               (20_000, 19_800, 0.03, 0.1, 40_000), (5000, 5000, -0.2, 0.01, 2000)):
            (a, ref_a), (b, ref_b) = _arm(rng, kind, n_a, 0.0), _arm(rng, kind, n_b, lift)
            ours.append(relative_effect(a, b, "b", alpha=alpha, tuning_users=tuning))
            cases.append({"kind": kind, "alpha": alpha, "tuning": tuning, "a": ref_a, "b": ref_b})
    theirs = _gbstats(cases)
    assert len(theirs) == len(ours) == 16
    for case, mine, ref in zip(cases, ours, theirs, strict=True):
        assert ref["error"] is None, (case["kind"], ref)
        what = f"{case['kind']} n={case['a']['n']}"
        assert mine.lift == close(ref["lift"]), what
        assert mine.lift_se == close(ref["se"]), what
        assert (mine.ci_low, mine.ci_high) == close((max(-1.0, ref["ci"][0]), ref["ci"][1])), what
        assert mine.p_value == close(ref["p"]), what
        assert (mine.cs_low, mine.cs_high) == close((max(-1.0, ref["cs"][0]), ref["cs"][1])), what
        assert mine.p_sequential == close(ref["p_sequential"]), what


def test_cuped_narrows_the_interval_on_a_world_with_a_pre_period():
    """The reason CUPED is on: the same experiment, the same estimand, a narrower interval — its variance
    shrunk by about ρ², the squared correlation of the metric with its pre-period value."""
    rng = np.random.default_rng(7)
    for kind in ("cuped_mean", "cuped_ratio"):
        (a, _), (b, _) = _arm(rng, kind, 20_000, 0.0, shape=0.5), _arm(rng, kind, 20_000, 0.05, shape=0.5)
        adjusted, _ = with_theta(a, b)  # a, with the pooled θ
        assert isinstance(adjusted, CupedMeanStat | CupedRatioStat)
        assert adjusted.theta > 0  # the pre-period explains part of the post-period
        plain: tuple[Stat, Stat]
        if isinstance(a, CupedMeanStat) and isinstance(b, CupedMeanStat):
            plain = (MeanStat(a.post), MeanStat(b.post))
        else:
            assert isinstance(a, CupedRatioStat) and isinstance(b, CupedRatioStat)
            plain = (RatioStat(a.m, a.d, a.products[0]), RatioStat(b.m, b.d, b.products[0]))
        with_cuped, without = relative_effect(a, b, "b"), relative_effect(plain[0], plain[1], "b")
        # A click-through rate is mostly a few binomial draws per user, so its pre-period explains less.
        assert with_cuped.lift_se < (0.9 if kind == "cuped_mean" else 0.97) * without.lift_se, kind
        assert math.isclose(with_cuped.lift, without.lift, abs_tol=3 * without.lift_se)
        if isinstance(adjusted, CupedMeanStat):  # ρ² from the control's sums
            rho2 = adjusted.covariance**2 / (adjusted.post.variance * adjusted.pre.variance)
            assert (with_cuped.lift_se / without.lift_se) ** 2 == pytest.approx(1 - rho2, abs=0.05)


def test_an_adjustment_with_nothing_to_explain_is_the_plain_statistic():
    flat = Moments(100, 100.0, 100.0)  # every user's pre-period value is 1: no variance to regress on
    post_a, post_b = Moments(100, 80.0, 120.0), Moments(100, 90.0, 140.0)
    a, b = with_theta(CupedMeanStat(post_a, flat, 80.0), CupedMeanStat(post_b, flat, 90.0))
    assert (a, b) == (MeanStat(post_a), MeanStat(post_b))


def test_the_users_still_needed_equal_gbstats_mid_experiment_power():
    from dinrec.experiments.power import users_still_needed

    cases: list[dict[str, Any]] = [
        {"kind": "power", "se": se, "n": n, "mde": mde, "alpha": alpha, "target": 0.8, "sequential": seq,
         "tuning": tuning}
        for se, n, mde, alpha, seq, tuning in ((0.04, 2000, 0.05, 0.05, False, 5000),
                                                (0.04, 2000, 0.05, 0.05, True, 5000),
                                                (0.01, 40_000, 0.02, 0.1, True, 80_000),
                                                (0.002, 40_000, 0.05, 0.05, False, 5000),  # powered already
                                                (0.3, 100, 0.01, 0.01, True, 5000))]
    theirs = _gbstats(cases)
    for case, ref in zip(cases, theirs, strict=True):
        mine = users_still_needed(case["se"], case["n"], case["mde"], alpha=case["alpha"], target=case["target"],
                                  sequential_tuning=case["tuning"] if case["sequential"] else None)
        assert ref["message"] == "successful", ref
        # gbstats says "successful" with no number when none are needed (a scaling factor of 0); dinrec says 0.
        assert mine == pytest.approx(ref["additional_users"] or 0.0, rel=1e-9), (case, ref)
    assert users_still_needed(0.002, 40_000, 0.05) == 0 and theirs[3]["additional_users"] is None


def _users(rng: np.random.Generator, n: int, lift: float) -> dict[str, np.ndarray]:
    """Per-user quantities as the stores count them: behaviours before exposure x, then impressions, clicks,
    buys, carts and the buys' value — every one of them driven by one persisting taste."""
    taste = rng.gamma(1.0, 1.0, n)
    x = np.minimum(rng.poisson(3 * taste), 50).astype(float)
    imps = (1 + rng.poisson(6 * taste)).astype(float)
    clicks = rng.binomial(imps.astype(int), np.clip(0.05 * taste * (1 + lift), 0, 1)).astype(float)
    buys = rng.poisson(0.3 * taste * (1 + lift)).astype(float)
    carts = rng.poisson(0.5 * taste).astype(float)
    value = buys * rng.lognormal(3, 0.5, n)
    return {"x": x, "n": imps, "c": clicks, "b": buys, "k": carts, "val": value}


def _variant_sums(u: dict[str, np.ndarray]):
    """The sums a store keeps (feature_store.online.base.AB_SUM_FIELDS) from per-user quantities."""
    from dinrec.experiments.stats import VariantSums

    f = {"users": len(u["x"]), **{q: u[q].sum() for q in ("n", "c", "b", "k", "val", "x")},
         **{f"{q}2": (u[q] ** 2).sum() for q in ("n", "c", "b", "k", "val", "x")},
         "nc": (u["n"] * u["c"]).sum(), "nb": (u["n"] * u["b"]).sum(),
         **{f"x{q}": (u["x"] * u[q]).sum() for q in ("n", "c", "b", "k", "val")}}
    f = {k: float(v) for k, v in f.items()}
    return VariantSums.from_fields(f)


def _reference(metric: str, u: dict[str, np.ndarray]) -> dict:
    """The same metric as gbstats' statistic from the per-user arrays (CUPED: x the covariate, 1 per user the
    pre-period denominator of a ratio)."""
    ratio = {"ctr": ("c", "n"), "conversions_per_impression": ("b", "n")}.get(metric)
    x, one = u["x"], np.ones_like(u["x"])
    if ratio is None:
        y = u[{"conversions_per_user": "b", "carts_per_user": "k", "value_per_user": "val"}[metric]]
        return {"n": len(y), "post": _sums(y), "pre": _sums(x), "post_pre": float((y * x).sum())}
    m, d = u[ratio[0]], u[ratio[1]]
    products = [float((p * q).sum()) for p, q in ((m, d), (m, x), (m, one), (d, x), (d, one), (x, one))]
    return {"n": len(m), "m": _sums(m), "d": _sums(d), "m_pre": _sums(x), "d_pre": _sums(one), "products": products}


def test_every_metric_from_the_stores_sums_equals_gbstats_with_cuped():
    """What the results page shows per metric (experiments.metrics, from the sums the stores keep) equals
    gbstats' CUPED (regression-adjusted) figures from the same users."""
    from dinrec.experiments.metrics import METRICS, compare_metric

    rng = np.random.default_rng(11)
    ours = []
    cases: list[dict[str, Any]] = []  # what the reference reads, as JSON (and the metric's name)
    for n_a, n_b, lift in ((3000, 3100, 0.0), (20_000, 19_500, 0.05)):
        ua, ub = _users(rng, n_a, 0.0), _users(rng, n_b, lift)
        sa, sb = _variant_sums(ua), _variant_sums(ub)
        for name, metric in METRICS.items():
            mine, applied = compare_metric(metric, sa, sb, "b")
            assert applied, name  # x explains part of every metric in this world
            ours.append(mine)
            kind = "cuped_ratio" if metric.ratio else "cuped_mean"
            cases.append({"kind": kind, "alpha": 0.05, "tuning": 5000, "a": _reference(name, ua),
                          "b": _reference(name, ub), "metric": name})
    theirs = _gbstats([{k: v for k, v in c.items() if k != "metric"} for c in cases])
    for case, mine, ref in zip(cases, ours, theirs, strict=True):
        assert ref["error"] is None, (case["metric"], ref)
        what = f"{case['metric']} n={case['a']['n']}"
        assert (mine.lift, mine.lift_se, mine.p_value, mine.p_sequential) == close(
            (ref["lift"], ref["se"], ref["p"], ref["p_sequential"])), what
        assert (mine.ci_low, mine.ci_high, mine.cs_low, mine.cs_high) == close(
            (max(-1.0, ref["ci"][0]), ref["ci"][1], max(-1.0, ref["cs"][0]), ref["cs"][1])), what
