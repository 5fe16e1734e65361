"""The metrics an experiment can be judged on, each built from the per-variant sums the stores keep
(:class:`experiments.stats.VariantSums`), and their analysis: per variant the metric and its standard error,
per treatment the relative effect (fixed and always-valid), CUPED-adjusted where a pre-exposure
covariate explains something.

Per-user means (conversions, carts, value per exposed user) and ratios of per-user sums (CTR, conversions
per impression) — GrowthBook's mean and ratio metrics, with the same statistics (gbstats parity:
tests/experiments/test_gbstats_parity.py). CUPED's covariate is what the store keeps for every exposed user:
the behaviours they had before their first exposure (``x``). A ratio metric is adjusted by the pre-period
ratio x / 1 (behaviours per user), a mean metric by x; θ is pooled over both arms, and where it is ~0 (no
pre-period, or nothing it explains) the plain statistic stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from dinrec.experiments.stats import (
    Comparison,
    CupedMeanStat,
    CupedRatioStat,
    MeanStat,
    Moments,
    RatioStat,
    Stat,
    VariantSums,
    corrected,
    relative_effect,
    with_theta,
)


@dataclass(frozen=True)
class Metric:
    """One metric: how its statistic (and its CUPED-adjusted one) is built from a variant's sums."""

    name: str
    label: str
    plain: Callable[[VariantSums], Stat]
    adjusted: Callable[[VariantSums], Stat]
    ratio: bool  # Σm / Σd over users (else a mean per exposed user)


def _pre(s: VariantSums) -> Moments:
    return Moments(s.users, s.pre, s.pre_sq)


def _per_user(s: VariantSums) -> Moments:  # the ratio covariate's denominator: 1 per user
    return Moments(s.users, s.users, s.users)


def _mean(total: Callable[[VariantSums], tuple[float, float, float]]) -> tuple[Callable, Callable]:
    """A per-user mean from (Σy, Σy², Σy·x) of a variant."""
    def plain(s: VariantSums) -> Stat:
        y, y2, _ = total(s)
        return MeanStat(Moments(s.users, y, y2))

    def adjusted(s: VariantSums) -> Stat:
        y, y2, yx = total(s)
        return CupedMeanStat(Moments(s.users, y, y2), _pre(s), yx)

    return plain, adjusted


def _ratio(parts: Callable[[VariantSums], tuple[float, ...]]) -> tuple[Callable, Callable]:
    """A ratio Σm / Σd from (Σm, Σm², Σd, Σd², Σm·d, Σm·x, Σd·x) of a variant."""
    def plain(s: VariantSums) -> Stat:
        m, m2, d, d2, md, _, _ = parts(s)
        return RatioStat(Moments(s.users, m, m2), Moments(s.users, d, d2), md)

    def adjusted(s: VariantSums) -> Stat:
        m, m2, d, d2, md, mx, dx = parts(s)
        # products: Σ m·d, m·m_pre, m·d_pre, d·m_pre, d·d_pre, m_pre·d_pre, with m_pre = x and d_pre = 1
        return CupedRatioStat(Moments(s.users, m, m2), Moments(s.users, d, d2), _pre(s), _per_user(s),
                              (md, mx, m, dx, d, s.pre))

    return plain, adjusted


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("ctr", "CTR (clicks per impression)",
           *_ratio(lambda s: (s.clicks, s.clicks_sq, s.impressions, s.impressions_sq, s.cross, s.pre_clicks,
                              s.pre_impressions)), ratio=True),
    Metric("conversions_per_user", "buys per exposed user",
           *_mean(lambda s: (s.buys, s.buys_sq, s.pre_buys)), ratio=False),
    Metric("conversions_per_impression", "buys per impression",
           *_ratio(lambda s: (s.buys, s.buys_sq, s.impressions, s.impressions_sq, s.impressions_buys, s.pre_buys,
                              s.pre_impressions)), ratio=True),
    Metric("carts_per_user", "carts per exposed user",
           *_mean(lambda s: (s.carts, s.carts_sq, s.pre_carts)), ratio=False),
    Metric("value_per_user", "value of buys per exposed user",
           *_mean(lambda s: (s.value, s.value_sq, s.pre_value)), ratio=False),
)}
METRIC_NAMES = tuple(METRICS)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compare_metric(metric: Metric, control: VariantSums, treatment: VariantSums, name: str, *, alpha: float = 0.05,
                   tuning_users: float = 5000, cuped: bool = True) -> tuple[Comparison, bool]:
    """``treatment``'s relative effect on ``metric`` over ``control``, and whether CUPED adjusted it (with
    ``cuped``, where the pooled θ is not ~0)."""
    if cuped:
        a, b = with_theta(metric.adjusted(control), metric.adjusted(treatment))
        applied = isinstance(a, (CupedMeanStat, CupedRatioStat))
        return relative_effect(a, b, name, alpha=alpha, tuning_users=tuning_users), applied
    return relative_effect(metric.plain(control), metric.plain(treatment), name, alpha=alpha,
                           tuning_users=tuning_users), False


def _figures(metric: Metric, s: VariantSums) -> dict:
    stat = metric.plain(s)
    se = math.sqrt(stat.variance / stat.n) if stat.n > 1 and stat.variance >= 0 else math.nan
    return {"mean": stat.unadjusted_mean if stat.n else None, "se": _finite(se)}


def analyse_metric(metric: Metric, sums: dict[str, VariantSums], control: str, *, alpha: float = 0.05,
                   tuning_users: float = 5000, cuped: bool = True, higher_is_better: bool = True,
                   as_stopped: dict[str, tuple[float, VariantSums, VariantSums]] | None = None) -> dict:
    """Per variant the metric (unadjusted) and its standard error; per treatment its relative effect over
    ``control`` — CUPED-adjusted where that applies, Holm-corrected with several treatments — with the
    sequential verdict read in the metric's direction ("worse" is a fall of a higher-is-better metric).

    ``as_stopped``: by stopped variant, (when, control's sums then, its sums then). A stopped arm's users
    leave the experiment but go on buying, and their buys still count under the arm they were exposed in
    (attribution by exposure), so its figures are shown as they stood when it was stopped (``as_of``),
    against control's then — after that the arm measures the default experience, not itself."""
    as_stopped = as_stopped or {}
    variants = {}
    for v, s in sums.items():
        variants[v] = _figures(metric, as_stopped[v][2] if v in as_stopped else s)
        if v in as_stopped:
            variants[v]["as_of"] = as_stopped[v][0]
    running = [v for v in sums if v != control and v not in as_stopped]
    pairs = {v: compare_metric(metric, sums[control], sums[v], v, alpha=alpha, tuning_users=tuning_users,
                               cuped=cuped) for v in running}
    corrected_rows = dict(zip(running, corrected([pairs[v][0] for v in running], alpha), strict=True))
    rows = []
    for v in (v for v in sums if v != control):
        if v in as_stopped:  # judged on its own when stopped: as it stood then
            t, base, mine = as_stopped[v]
            c, applied = compare_metric(metric, base, mine, v, alpha=alpha, tuning_users=tuning_users, cuped=cuped)
        else:
            base, mine = sums[control], sums[v]
            c, applied = corrected_rows[v], pairs[v][1]
        row = {k: (None if isinstance(x, float) and math.isnan(x) else x) for k, x in asdict(c).items()}
        # the two means compared (unadjusted): a stopped arm's and control's both as of its stop
        row["control_mean"], row["variant_mean"] = _figures(metric, base)["mean"], _figures(metric, mine)["mean"]
        if not higher_is_better and row["sequential"] != "inconclusive":
            row["sequential"] = "worse" if row["sequential"] == "better" else "better"
        row["cuped"] = applied
        if v in as_stopped:
            row["as_of"] = t
        rows.append(row)
    return {"label": metric.label, "ratio": metric.ratio, "variants": variants, "comparisons": rows}
