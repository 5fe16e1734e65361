"""A/B statistics, from per-variant sums of per-user quantities, as GrowthBook's gbstats computes them.

Users are randomised, impressions are not: one user's impressions share that user's taste, so CTR
(clicks / impressions) is a ratio metric whose variance comes from the delta method over users,
not from a binomial over impressions (which would understate it and make every test too eager).
Everything here needs only sums per variant — for CTR what the ingest keeps in Redis:

    users, Σn, Σc, Σn², Σc², Σn·c      (n, c: one user's impressions and clicks)

* the statistics: :class:`MeanStat` (a per-user mean), :class:`RatioStat` (Σm / Σd), and both adjusted by
  the user's pre-exposure value (CUPED: :class:`CupedMeanStat`, :class:`CupedRatioStat`; θ by
  :func:`with_theta`);
* :func:`relative_effect` — a treatment's relative lift over the control with a fixed-horizon Welch t
  interval and p-value, and an always-valid confidence sequence (Waudby-Smith et al., "Time-uniform
  central limit theory and asymptotic confidence sequences", 2023: the conjugate-mixture margin, tuned
  to be tightest near ``tuning_users``) with its p-value, that stays valid however often it is looked
  at — that is the one the guardrail acts on. Equal to gbstats' figures from the same sums
  (tests/experiments/test_gbstats_parity.py), but for two cases noted on :class:`Comparison`;
* :func:`compare` and :func:`analyse` — CTR from :class:`VariantSums`;
* :func:`srm_p_value` — sample-ratio mismatch: a χ² test of users per variant against the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from dinrec.feature_store.online.base import AB_SUM_FIELDS


@dataclass(frozen=True)
class VariantSums:
    """Sufficient statistics of one variant: users, and sums over users of n, c, n², c², n·c (impressions and
    clicks); of b (buys), k (carts) and v (the buys' value) with their squares and n·b; and of x, the user's
    behaviours before their first exposure (CUPED's covariate), with x² and x times each of n, c, b, k, v.
    The stores keep them under the short names of feature_store.online.base.AB_SUM_FIELDS (:meth:`from_fields`)."""

    users: int
    impressions: float
    clicks: float
    impressions_sq: float
    clicks_sq: float
    cross: float
    tail_clicks: float = 0.0  # clicks on long-tail items (events.long_tail, by popularity at the time)
    buys: float = 0.0
    buys_sq: float = 0.0
    impressions_buys: float = 0.0
    carts: float = 0.0
    carts_sq: float = 0.0
    value: float = 0.0
    value_sq: float = 0.0
    pre: float = 0.0
    pre_sq: float = 0.0
    pre_impressions: float = 0.0
    pre_clicks: float = 0.0
    pre_buys: float = 0.0
    pre_carts: float = 0.0
    pre_value: float = 0.0

    @classmethod
    def empty(cls) -> VariantSums:
        """A variant nobody has been counted in yet."""
        return cls(0, 0, 0, 0, 0, 0)

    @classmethod
    def from_fields(cls, row: dict[str, float]) -> VariantSums:
        """From a store's sums by their short names (absent: 0 — counts kept before a field existed)."""
        # AB_SUM_FIELDS lists them in this class's field order.
        return cls(int(row.get("users", 0)), *(float(row.get(name, 0.0)) for name in AB_SUM_FIELDS[1:]))

    @classmethod
    def of(cls, per_user: Sequence[tuple[float, float]]) -> VariantSums:
        """From (impressions, clicks) per user."""
        return cls(len(per_user), sum(n for n, _ in per_user), sum(c for _, c in per_user),
                   sum(n * n for n, _ in per_user), sum(c * c for _, c in per_user),
                   sum(n * c for n, c in per_user))

    @property
    def ctr(self) -> float:
        return self.clicks / self.impressions if self.impressions else 0.0

    def ratio(self) -> RatioStat:
        """CTR as a ratio statistic: clicks over impressions, per user."""
        return RatioStat(Moments(self.users, self.clicks, self.clicks_sq),
                         Moments(self.users, self.impressions, self.impressions_sq), self.cross)

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
class Moments:
    """Sums over users of one per-user quantity x: users, Σx, Σx² (gbstats' SampleMeanStatistic)."""

    n: int
    sum: float
    sum_sq: float

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n else 0.0

    @property
    def variance(self) -> float:
        """The sample variance of x over users (n − 1)."""
        return (self.sum_sq - self.sum**2 / self.n) / (self.n - 1) if self.n > 1 else 0.0


def _covariance(a: Moments, b: Moments, sum_of_products: float) -> float:
    """The sample covariance over users of two per-user quantities, from Σa, Σb and Σab."""
    n = a.n
    return (sum_of_products - a.sum * b.sum / n) / (n - 1) if n > 1 else 0.0


def _ratio_variance(mean_m: float, var_m: float, mean_d: float, var_d: float, cov_md: float) -> float:
    """Var(m̄ / d̄) by the delta method (per unit: divide by n for the estimate's)."""
    if mean_d == 0:
        return 0.0
    return var_m / mean_d**2 + var_d * mean_m**2 / mean_d**4 - 2 * cov_md * mean_m / mean_d**3


@dataclass(frozen=True)
class MeanStat:
    """A per-user mean (conversions per user, value per user)."""

    x: Moments

    @property
    def n(self) -> int:
        return self.x.n

    @property
    def mean(self) -> float:
        return self.x.mean

    unadjusted_mean = mean

    @property
    def variance(self) -> float:
        return self.x.variance


@dataclass(frozen=True)
class RatioStat:
    """A ratio of per-user sums, Σm / Σd (CTR: clicks over impressions); its variance by the delta method
    over users, the unit of randomisation."""

    m: Moments
    d: Moments
    m_d: float  # Σ m·d

    @property
    def n(self) -> int:
        return self.m.n

    @property
    def mean(self) -> float:
        return self.m.sum / self.d.sum if self.d.sum else 0.0

    unadjusted_mean = mean

    @property
    def variance(self) -> float:
        if self.d.mean == 0 or self.n <= 1:
            return 0.0
        return _ratio_variance(self.m.mean, self.m.variance, self.d.mean, self.d.variance,
                               _covariance(self.m, self.d, self.m_d))


@dataclass(frozen=True)
class CupedMeanStat:
    """A per-user mean adjusted by a pre-exposure covariate (CUPED): x − θ·x_pre, with θ pooled over both
    arms (:func:`with_theta`), so the adjustment moves neither arm's expected mean apart from the other's."""

    post: Moments
    pre: Moments
    post_pre: float  # Σ x·x_pre
    theta: float = 0.0

    @property
    def n(self) -> int:
        return self.post.n

    @property
    def mean(self) -> float:
        return self.post.mean - self.theta * self.pre.mean

    @property
    def unadjusted_mean(self) -> float:
        return self.post.mean

    @property
    def covariance(self) -> float:
        return _covariance(self.post, self.pre, self.post_pre)

    @property
    def variance(self) -> float:
        if self.n <= 1:
            return 0.0
        return self.post.variance + self.theta**2 * self.pre.variance - 2 * self.theta * self.covariance


@dataclass(frozen=True)
class CupedRatioStat:
    """A ratio adjusted by the same ratio before exposure: m/d − θ·m_pre/d_pre, its variance by the delta
    method over the four per-user quantities (m, d, m_pre, d_pre: their 4×4 covariance)."""

    m: Moments
    d: Moments
    m_pre: Moments
    d_pre: Moments
    products: tuple[float, float, float, float, float, float]  # Σ m·d, m·m_pre, m·d_pre, d·m_pre, d·d_pre,
    # m_pre·d_pre
    theta: float = 0.0

    @property
    def n(self) -> int:
        return self.m.n

    @property
    def mean_post(self) -> float:
        return self.m.sum / self.d.sum if self.d.sum else 0.0

    @property
    def mean_pre(self) -> float:
        return self.m_pre.sum / self.d_pre.sum if self.d_pre.sum else 0.0

    @property
    def mean(self) -> float:
        if self.d.sum == 0 or self.d_pre.sum == 0:
            return 0.0
        return self.mean_post - self.theta * self.mean_pre

    @property
    def unadjusted_mean(self) -> float:
        return self.mean_post

    def covariance_matrix(self) -> list[list[float]]:
        """Over users, of (m, d, m_pre, d_pre)."""
        parts = (self.m, self.d, self.m_pre, self.d_pre)
        pairs = {(0, 1): 0, (0, 2): 1, (0, 3): 2, (1, 2): 3, (1, 3): 4, (2, 3): 5}  # into ``products``
        cov = [[0.0] * 4 for _ in range(4)]
        for i in range(4):
            cov[i][i] = parts[i].variance
            for j in range(i + 1, 4):
                cov[i][j] = cov[j][i] = _covariance(parts[i], parts[j], self.products[pairs[i, j]])
        return cov

    def gradient(self) -> list[float]:
        """∂(m̄/d̄ − θ·m̄_pre/d̄_pre) / ∂(m̄, d̄, m̄_pre, d̄_pre)."""
        mm, md, pm, pd = self.m.mean, self.d.mean, self.m_pre.mean, self.d_pre.mean
        if md == 0 or pd == 0:
            return [0.0] * 4
        return [1 / md, -mm / md**2, -self.theta / pd, self.theta * pm / pd**2]

    @property
    def variance(self) -> float:
        return _quadratic(self.gradient(), self.covariance_matrix())

    def pre_parts(self) -> tuple[float, float]:
        """At θ = 1: the variance of the pre-period ratio's term and its covariance with the post-period's
        (what θ is regressed from)."""
        g, cov = replace(self, theta=1.0).gradient(), self.covariance_matrix()
        pre = sum(g[i] * cov[i][j] * g[j] for i in (2, 3) for j in (2, 3))
        cross = sum(g[i] * cov[i][j] * g[j] for i in (2, 3) for j in (0, 1))
        return pre, cross


def _quadratic(g: Sequence[float], cov: Sequence[Sequence[float]]) -> float:
    """gᵀ·Σ·g."""
    return sum(g[i] * cov[i][j] * g[j] for i in range(len(g)) for j in range(len(g)))


Stat = MeanStat | RatioStat | CupedMeanStat | CupedRatioStat


def with_theta(a: Stat, b: Stat) -> tuple[Stat, Stat]:
    """CUPED's θ, pooled over both arms (GrowthBook's choice): the regression of the metric on its
    pre-exposure value over all users. An adjustment with nothing to explain (θ ≈ 0: no pre-period, or
    no variance in it) falls back to the plain statistic."""
    if isinstance(a, CupedMeanStat) and isinstance(b, CupedMeanStat):
        n = a.n + b.n
        post = Moments(n, a.post.sum + b.post.sum, a.post.sum_sq + b.post.sum_sq)
        pre = Moments(n, a.pre.sum + b.pre.sum, a.pre.sum_sq + b.pre.sum_sq)
        theta = 0.0
        if pre.variance != 0 and post.variance != 0:
            theta = _covariance(post, pre, a.post_pre + b.post_pre) / pre.variance
        if theta == 0:
            return MeanStat(a.post), MeanStat(b.post)
        return replace(a, theta=theta), replace(b, theta=theta)
    if isinstance(a, CupedRatioStat) and isinstance(b, CupedRatioStat):
        (pre_a, cross_a), (pre_b, cross_b) = a.pre_parts(), b.pre_parts()
        theta = -(cross_a + cross_b) / (pre_a + pre_b) if pre_a + pre_b else 0.0
        if abs(theta) < 1e-8:
            return (RatioStat(a.m, a.d, a.products[0]), RatioStat(b.m, b.d, b.products[0]))
        return replace(a, theta=theta), replace(b, theta=theta)
    return a, b


def _relative_variance(a: Stat, b: Stat) -> float:
    """Var of (b − a) / a's unadjusted mean: the delta method, with CUPED's adjustment where it applies.
    An arm with no users yet has no variance to speak of: 0, which :func:`relative_effect` reads as nothing
    to compare (a timeline's first point can hold control's first users and none of a treatment's)."""
    if a.n < 1 or b.n < 1:
        return 0.0
    mean_a = a.unadjusted_mean
    if isinstance(a, CupedMeanStat) and isinstance(b, CupedMeanStat):
        if b.n * mean_a**2 == 0 or a.n * mean_a**2 == 0:
            return 0.0
        treatment = b.variance / (b.n * mean_a**2)
        const = -b.post.mean
        control = (a.post.variance * const**2 / a.post.mean**2 + 2 * a.theta * a.covariance * const / a.post.mean
                   + a.theta**2 * a.pre.variance) / (a.n * mean_a**2)
        return treatment + control
    if isinstance(a, CupedRatioStat) and isinstance(b, CupedRatioStat):
        if mean_a == 0 or a.d.mean == 0:
            return 0.0
        g_abs = (b.mean - a.mean) * math.copysign(1.0, mean_a)
        den = abs(mean_a)
        ga, gb = a.gradient(), b.gradient()
        control_grad = [-(den + g_abs) / a.d.mean / den**2, a.m.mean * (den + g_abs) / a.d.mean**2 / den**2,
                        -ga[2] / den, -ga[3] / den]
        treatment_grad = [x / den for x in gb]
        return (_quadratic(control_grad, a.covariance_matrix()) / a.n
                + _quadratic(treatment_grad, b.covariance_matrix()) / b.n)
    if mean_a == 0:
        return 0.0
    return _ratio_variance(b.unadjusted_mean, b.variance / b.n, mean_a, a.variance / a.n, 0.0)


@dataclass(frozen=True)
class Comparison:
    """A treatment against the control: the relative lift of the metric (0.05 = +5 %), as GrowthBook's
    frequentist engine (gbstats) computes it from the same sums — the delta-method standard error, a
    Welch t interval and p-value for one look at a planned end, and the always-valid confidence sequence
    with its p-value for every look. Two differences, where gbstats gives up or cannot be right: bounds
    below −100 % (a lift cannot be) are cut there, and an arm with no variance (not one click) is compared
    as if its users varied as control's do (:func:`relative_effect`)."""

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
    p_sequential: float = math.nan  # the always-valid p-value (1 / the mixture e-value)


def conjmix_margin(t: float, rho2: float, alpha: float) -> float:
    """Half-width, in standard deviations of one unit, of the asymptotic confidence sequence at
    sample size ``t``: sqrt(2(tρ²+1)/(t²ρ²) · log(sqrt(tρ²+1)/α)) (Waudby-Smith et al., eq. 9)."""
    return math.sqrt(2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))


def best_rho2(t_opt: float, alpha: float) -> float:
    """The tuning that makes the sequence tightest near ``t_opt`` units (Waudby-Smith et al.'s
    approximation); any ρ² > 0 gives a valid sequence, this only chooses where it is narrowest."""
    return (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / t_opt


def relative_effect(control: Stat, treatment: Stat, name: str, *, alpha: float = 0.05,
                    tuning_users: float = 5000) -> Comparison:
    """``treatment``'s relative lift over ``control`` (CUPED statistics get their pooled θ here).
    Nothing to compare yet (no users, or a control mean of 0): NaN figures, "inconclusive"."""
    a, b = with_theta(control, treatment)
    var = _relative_variance(a, b)
    if var <= 0 < a.variance and b.n >= 2 and a.unadjusted_mean:
        # gbstats answers nothing when an arm has no variance, but a dead arm (not one click) is exactly
        # what the guardrail must stop: its users are taken to vary as control's do.
        var = _ratio_variance(b.unadjusted_mean, a.variance / b.n, a.unadjusted_mean, a.variance / a.n, 0.0)
    if a.n < 2 or b.n < 2 or a.mean == 0 or a.unadjusted_mean == 0 or var <= 0 or not math.isfinite(var):
        nan = math.nan
        return Comparison(name, nan, nan, nan, nan, nan, nan, nan, False, "inconclusive", nan)
    from scipy import stats  # lazily: the stores import this module for VariantSums alone

    lift = (b.mean - a.mean) / abs(a.unadjusted_mean)
    se = math.sqrt(var)
    va, vb = a.variance / a.n, b.variance / b.n
    dof = (va + vb) ** 2 / (vb**2 / (b.n - 1) + va**2 / (a.n - 1)) if va + vb > 0 else math.inf  # Welch
    p = 2 * (1 - float(stats.t.cdf(abs(lift) / se, dof)))
    half = float(stats.t.ppf(1 - alpha / 2, dof)) * se
    n = a.n + b.n
    rho2 = best_rho2(tuning_users, alpha)
    seq_half = se * math.sqrt(n) * conjmix_margin(n, rho2, alpha)
    # The mixture martingale's e-value at the estimate (Waudby-Smith et al., eq. 155), in logs: it overflows
    # a float long before the p-value (its inverse) stops being worth printing.
    st2 = lift**2 * n / var
    log_evalue = rho2 * st2 / (2 * (n * rho2 + 1)) - 0.5 * math.log(n * rho2 + 1)
    cs = (max(-1.0, lift - seq_half), lift + seq_half)
    return Comparison(name, lift, se, max(-1.0, lift - half), lift + half, p, cs[0], cs[1], p < alpha, verdict(*cs),
                      min(1.0, math.exp(-log_evalue)))


def compare(control: VariantSums, treatment: VariantSums, name: str, *, alpha: float = 0.05,
            tuning_users: float = 5000) -> Comparison:
    """The relative CTR lift of ``treatment`` over ``control``."""
    return relative_effect(control.ratio(), treatment.ratio(), name, alpha=alpha, tuning_users=tuning_users)


def intersect(previous: tuple[float, float] | None, low: float, high: float) -> tuple[float, float]:
    """The running intersection of a confidence sequence over the looks so far: each look's interval
    is valid at every time, so their intersection is too, and it only narrows — a bound once past
    zero stays past it, so a verdict reached is never contradicted by a later look."""
    if math.isnan(low) or math.isnan(high):  # nothing to compare at this look
        return previous if previous is not None else (low, high)
    if previous is None or math.isnan(previous[0]) or math.isnan(previous[1]):
        return low, high
    return max(previous[0], low), min(previous[1], high)


def verdict(low: float, high: float, *, higher_is_better: bool = True) -> str:
    """"better" or "worse" when the interval of a relative effect excludes 0 (read in the metric's direction)."""
    if not higher_is_better:
        low, high = -high, -low
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


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (family-wise error at alpha over the comparisons): the k-th smallest p
    times (m − k + 1), never below the one before; NaN (nothing to compare) stays NaN and is not counted."""
    known = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    out, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, p * (len(known) - rank)))
        out[i] = running
    return out


def corrected(comparisons: list[Comparison], alpha: float) -> list[Comparison]:
    """With several treatments, each judged at Holm's level over all of them: the fixed test on its Holm-
    adjusted p-value, the sequential verdict only where its Holm-adjusted always-valid p-value is below
    ``alpha`` (always-valid p-values stay valid at any look, and Holm needs no more of them); the p-values
    shown are the adjusted ones. One treatment: unchanged."""
    if len(comparisons) < 2:
        return comparisons
    fixed, sequential = holm([c.p_value for c in comparisons]), holm([c.p_sequential for c in comparisons])
    return [replace(c, p_value=pf, p_sequential=ps, significant=pf < alpha,
                    sequential=c.sequential if ps < alpha else "inconclusive")
            for c, pf, ps in zip(comparisons, fixed, sequential, strict=True)]


def analyse(sums: dict[str, VariantSums], control: str, weights: dict[str, float] | None = None, *,
            alpha: float = 0.05, srm_alpha: float = 0.001, tuning_users: float = 5000) -> dict:
    """Per-variant figures, each treatment against ``control`` (Holm-corrected with several), the SRM
    check with the expected and observed shares of users, as JSON-ready data."""
    names = list(sums)
    weights = weights or {v: 1.0 for v in names}
    users = [sums[v].users for v in names]
    srm = srm_p_value(users, [weights[v] for v in names])
    comparisons = corrected([compare(sums[control], sums[v], v, alpha=alpha, tuning_users=tuning_users)
                             for v in names if v != control], alpha)
    total_weight = sum(weights[v] for v in names)
    return {
        "control": control,
        "variants": {v: {"users": s.users, "impressions": s.impressions, "clicks": s.clicks, "ctr": s.ctr,
                         "ctr_se": math.sqrt(s.ctr_variance()) if math.isfinite(s.ctr_variance()) else None,
                         "long_tail_click_share": s.tail_clicks / s.clicks if s.clicks else None}
                     for v, s in sums.items()},
        "comparisons": [_json_safe(asdict(c)) for c in comparisons],
        "correction": "holm" if len(comparisons) > 1 else None,
        "srm": {"p_value": srm, "flagged": srm < srm_alpha,
                "expected_share": {v: weights[v] / total_weight for v in names},
                "observed_share": {v: (sums[v].users / sum(users)) if sum(users) else None for v in names}},
        "alpha": alpha,
    }
