"""A/B statistics on CTR, from per-variant sums of per-user counts.

Users are randomised, impressions are not: one user's impressions share that user's taste, so CTR
(clicks / impressions) is a ratio metric whose variance comes from the delta method over users,
not from a binomial over impressions (which would understate it and make every test too eager).
Everything here needs only these sums per variant — what the ingest keeps in Redis:

    users, Σn, Σc, Σn², Σc², Σn·c      (n, c: one user's impressions and clicks)

* :func:`analyse` — per variant CTR and its variance; per treatment the relative lift against the
  control with a fixed-horizon confidence interval and p-value, and an always-valid confidence
  sequence (Waudby-Smith et al., "Time-uniform central limit theory and asymptotic confidence
  sequences", 2023: the conjugate-mixture margin, tuned to be tightest near ``tuning_users``) that
  stays valid however often it is looked at — that is the one the guardrail acts on;
* :func:`srm_p_value` — sample-ratio mismatch: a χ² test of users per variant against the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class VariantSums:
    """Sufficient statistics of one variant: users, and sums over users of n, c, n², c², n·c."""

    users: int
    impressions: float
    clicks: float
    impressions_sq: float
    clicks_sq: float
    cross: float
    tail_clicks: float = 0.0  # clicks on long-tail items (feature_store.long_tail, by popularity at the time)

    @classmethod
    def of(cls, per_user: Sequence[tuple[float, float]]) -> VariantSums:
        """From (impressions, clicks) per user."""
        return cls(len(per_user), sum(n for n, _ in per_user), sum(c for _, c in per_user),
                   sum(n * n for n, _ in per_user), sum(c * c for _, c in per_user),
                   sum(n * c for n, c in per_user))

    @property
    def ctr(self) -> float:
        return self.clicks / self.impressions if self.impressions else 0.0

    def ctr_variance(self) -> float:
        """Var(CTR) by the delta method over users: CTR = mean(c) / mean(n)."""
        u = self.users
        if u < 2 or self.impressions <= 0:
            return math.inf
        mn, mc = self.impressions / u, self.clicks / u
        var_n = (self.impressions_sq - u * mn * mn) / (u - 1)
        var_c = (self.clicks_sq - u * mc * mc) / (u - 1)
        cov = (self.cross - u * mn * mc) / (u - 1)
        return max(0.0, (var_c / mn**2 - 2 * mc * cov / mn**3 + mc**2 * var_n / mn**4) / u)


@dataclass(frozen=True)
class Comparison:
    """A treatment against the control: relative lift of CTR (0.05 = +5 %)."""

    variant: str
    lift: float
    lift_se: float
    ci_low: float            # fixed-horizon interval: valid for one look at a planned end
    ci_high: float
    p_value: float
    cs_low: float            # confidence sequence: valid at every look
    cs_high: float
    significant: bool        # the fixed-horizon test: p < alpha
    sequential: str          # "better", "worse" (the CS excludes 0 on that side) or "inconclusive"


def conjmix_margin(t: float, rho2: float, alpha: float) -> float:
    """Half-width, in standard deviations of one unit, of the asymptotic confidence sequence at
    sample size ``t``: sqrt(2(tρ²+1)/(t²ρ²) · log(sqrt(tρ²+1)/α))."""
    return math.sqrt(2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))


def best_rho2(t_opt: float, alpha: float) -> float:
    """The tuning that makes the sequence tightest near ``t_opt`` units (Waudby-Smith et al.'s
    approximation); any ρ² > 0 gives a valid sequence, this only chooses where it is narrowest."""
    return (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / t_opt


def compare(control: VariantSums, treatment: VariantSums, name: str, *, alpha: float = 0.05,
            tuning_users: float = 5000) -> Comparison:
    """The relative CTR lift of ``treatment`` over ``control``. Intervals are taken on the log of the
    CTR ratio and mapped back, so they never reach below −100 % (a ratio of CTRs cannot); with no
    treatment clicks yet (log undefined) the delta-method interval on the lift, cut at −100 %."""
    mc, mt = control.ctr, treatment.ctr
    vc, vt = control.ctr_variance(), treatment.ctr_variance()
    if mc <= 0 or not math.isfinite(vc) or not math.isfinite(vt):
        nan = math.nan
        return Comparison(name, nan, nan, nan, nan, nan, nan, nan, False, "inconclusive")
    from scipy import stats  # lazily: the stores import this module for VariantSums alone

    lift = mt / mc - 1
    var = vt / mc**2 + mt**2 * vc / mc**4  # delta method for a ratio of independent estimates
    se = math.sqrt(var)
    z = stats.norm.ppf(1 - alpha / 2)
    n = control.users + treatment.users
    margin = math.sqrt(n) * conjmix_margin(n, best_rho2(tuning_users, alpha), alpha)
    if mt > 0:  # log(mt / mc) ± ...: var of a log ratio by the delta method
        log_lift, log_se = math.log(mt / mc), math.sqrt(vt / mt**2 + vc / mc**2)
        p = float(2 * stats.norm.sf(abs(log_lift) / log_se)) if log_se > 0 else (0.0 if log_lift else 1.0)
        ci = (math.expm1(log_lift - z * log_se), math.expm1(log_lift + z * log_se))
        cs = (math.expm1(log_lift - log_se * margin), math.expm1(log_lift + log_se * margin))
    else:
        p = float(2 * stats.norm.sf(abs(lift) / se)) if se > 0 else (0.0 if lift else 1.0)
        ci = (max(-1.0, lift - z * se), lift + z * se)
        cs = (max(-1.0, lift - se * margin), lift + se * margin)
    return Comparison(name, lift, se, ci[0], ci[1], p, cs[0], cs[1], p < alpha, verdict(*cs))


def intersect(previous: tuple[float, float] | None, low: float, high: float) -> tuple[float, float]:
    """The running intersection of a confidence sequence over the looks so far: each look's interval
    is valid at every time, so their intersection is too, and it only narrows — a bound once past
    zero stays past it, so a verdict reached is never contradicted by a later look."""
    if math.isnan(low) or math.isnan(high):  # nothing to compare at this look
        return previous if previous is not None else (low, high)
    if previous is None or math.isnan(previous[0]) or math.isnan(previous[1]):
        return low, high
    return max(previous[0], low), min(previous[1], high)


def verdict(low: float, high: float) -> str:
    return "better" if low > 0 else "worse" if high < 0 else "inconclusive"


def srm_p_value(users: Sequence[int], weights: Sequence[float]) -> float:
    """χ² goodness of fit of users per variant against the configured weights (1.0: no data)."""
    from scipy import stats

    total = sum(users)
    if total == 0 or len(users) < 2:
        return 1.0
    expected = [total * w / sum(weights) for w in weights]
    return float(stats.chisquare(list(users), expected).pvalue)


def _json_safe(row: dict) -> dict:
    """NaN (nothing to compare yet) as null: JSON has no NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def analyse(sums: dict[str, VariantSums], control: str, weights: dict[str, float] | None = None, *,
            alpha: float = 0.05, srm_alpha: float = 0.001, tuning_users: float = 5000) -> dict:
    """Per-variant figures, each treatment against ``control``, and the SRM check, as JSON-ready data."""
    names = list(sums)
    weights = weights or {v: 1.0 for v in names}
    srm = srm_p_value([sums[v].users for v in names], [weights[v] for v in names])
    return {
        "control": control,
        "variants": {v: {"users": s.users, "impressions": s.impressions, "clicks": s.clicks, "ctr": s.ctr,
                         "ctr_se": math.sqrt(s.ctr_variance()) if math.isfinite(s.ctr_variance()) else None,
                         "long_tail_click_share": s.tail_clicks / s.clicks if s.clicks else None}
                     for v, s in sums.items()},
        "comparisons": [_json_safe(asdict(compare(sums[control], sums[v], v, alpha=alpha, tuning_users=tuning_users)))
                        for v in names if v != control],
        "srm": {"p_value": srm, "flagged": srm < srm_alpha},
        "alpha": alpha,
    }
