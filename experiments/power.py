"""Power: how many users an experiment needs — planned before it starts, and still needed while it runs.

GrowthBook's frequentist formulas, so a team plans with the numbers its results page would give:

* :func:`power`, :func:`mde` and :func:`plan` — before the experiment, from the metric's mean and per-user
  variance (GrowthBook's power calculator, packages/shared/src/power/power.ts: the relative lift's
  delta-method variance; with sequential testing, the fixed standard error widened by the confidence
  sequence's margin over the normal quantile);
* :func:`users_still_needed` — while it runs, from the lift's current standard error: how many more users
  (both arms) until a lift of ``mde`` would be found with ``target`` power (gbstats' MidExperimentPower,
  without a prior; tests/experiments/test_gbstats_parity.py checks it against gbstats itself).

Relative effects throughout (0.05 = +5 %); two-sided tests at ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypedDict

from dinrec.experiments.stats import best_rho2, conjmix_margin


def _norm():
    from scipy.stats import norm  # lazily, as experiments.stats does

    return norm


def _relative_variance(mean: float, variance: float, per_arm: float, effect: float) -> float:
    """Var of the relative lift with ``per_arm`` users a side, the treatment's mean ``mean·(1 + effect)``."""
    treated = mean * (1 + effect)
    return variance / (mean**2 * per_arm) + variance * treated**2 / (mean**4 * per_arm)


def _sequential_widening(n: float, alpha: float, tuning: float) -> float:
    """The confidence sequence's half-width over the fixed interval's, at ``n`` users in the comparison."""
    return math.sqrt(n) * conjmix_margin(n, best_rho2(tuning, alpha), alpha) / _norm().ppf(1 - alpha / 2)


def power(mean: float, variance: float, effect: float, users: float, *, variations: int = 2, alpha: float = 0.05,
          sequential_tuning: float | None = None) -> float:
    """The chance a two-sided test finds a true relative lift of ``effect`` with ``users`` in the experiment
    (split over ``variations``), the metric's per-user ``variance`` around its ``mean``."""
    norm = _norm()
    per_arm = users / variations
    se = math.sqrt(_relative_variance(mean, variance, per_arm, effect))
    if sequential_tuning:
        se *= _sequential_widening(2 * per_arm, alpha, sequential_tuning)
    z = norm.ppf(1 - alpha / 2)
    return float(1 - norm.cdf(z - effect / se) + norm.cdf(-z - effect / se))


def mde(mean: float, variance: float, users: float, *, variations: int = 2, alpha: float = 0.05, target: float = 0.8,
        sequential_tuning: float | None = None) -> float | None:
    """The smallest relative lift found with ``target`` power (None: too few users for any)."""
    if target <= alpha:
        raise ValueError("the target power must be above alpha")
    norm = _norm()
    per_arm = users / variations
    z = norm.ppf(1 - alpha / 2) - norm.ppf(1 - target)
    v = variance * (_sequential_widening(2 * per_arm, alpha, sequential_tuning) ** 2 if sequential_tuning else 1)
    if per_arm <= v * z**2 / mean**2:
        return None
    # The treated mean m' at which the relative lift's z-score reaches z: power.ts' quadratic in m'.
    sigma2 = v / per_arm
    a, b, c = 1 - z**2 * sigma2 / mean**2, -2 * mean, mean**2 - z**2 * sigma2
    treated = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    return (treated - mean) / mean


class _Test(TypedDict):
    """How the experiment is tested: :func:`power`'s and :func:`mde`'s keyword arguments."""

    variations: int
    alpha: float
    sequential_tuning: float | None


@dataclass(frozen=True)
class PlanDay:
    day: int
    users: float
    power: float  # for the planned effect
    mde: float | None  # found with the target power that day


def plan(mean: float, variance: float, effect: float, users_per_day: float, *, days: int = 28, variations: int = 2,
         alpha: float = 0.05, target: float = 0.8, sequential_tuning: float | None = None) -> dict:
    """Day by day: the power for ``effect`` and the MDE at ``target`` power; the first day ``effect`` reaches
    ``target`` power (rounded to two places, as GrowthBook's calculator rounds), or None within ``days``."""
    kw = _Test(variations=variations, alpha=alpha, sequential_tuning=sequential_tuning)
    rows = [PlanDay(d, d * users_per_day, power(mean, variance, effect, d * users_per_day, **kw),
                    mde(mean, variance, d * users_per_day, target=target, **kw)) for d in range(1, days + 1)]
    reached = next((r.day for r in rows if round(r.power, 2) >= target), None)
    return {"effect": effect, "target_power": target, "days_needed": reached,
            "users_needed": reached * users_per_day if reached else None, "days": [r.__dict__ for r in rows]}


def users_still_needed(se: float, users: int, mde_: float, *, alpha: float = 0.05, target: float = 0.8,
                       sequential_tuning: float | None = None) -> float | None:
    """More users (both arms together) until a relative lift of ``mde_`` would be found with ``target``
    power, from the lift's standard error ``se`` now, with ``users`` in the comparison: 0 when already
    powered, None when no amount within 2²⁷ times as many would do. New users shrink the variance as
    1 / (1 + k) for k times the users so far (gbstats' scaling factor, found by bisection)."""
    norm = _norm()
    mde_ = abs(mde_)
    var = se**2
    z = norm.ppf(1 - alpha / 2)

    def power_at(k: float) -> float:
        adjusted = var / (1 + k)
        if sequential_tuning:
            half = math.sqrt(users * var) * conjmix_margin(users * (1 + k), best_rho2(sequential_tuning, alpha), alpha)
        else:
            half = z * math.sqrt(adjusted)
        sd = math.sqrt(adjusted)
        return float(1 - norm.cdf((half - mde_) / sd) + norm.cdf(-(half + mde_) / sd))

    if power_at(0) > target:
        return 0.0
    k = 1.0
    for _ in range(27):
        if power_at(k) >= target:
            break
        k *= 2
    else:
        return None
    low, high, diff = 0.0, k, power_at(k) - target
    for _ in range(100):
        if diff > 0:
            high = k
        else:
            low = k
        k = 0.5 * (low + high)
        diff = power_at(k) - target
        if abs(diff) < 1e-5:
            break
    return users * k


TARGET_POWER = 0.8  # GrowthBook's default, and the usual one


def still_needed(comparisons: list[dict], users: dict[str, int], control: str, mde_: float,
                 users_per_day: float | None, *, stopped: Collection[str] = (), alpha: float = 0.05,
                 tuning: float = 5000) -> dict:
    """Per treatment of ``analyse``'s ``comparisons`` still undecided: the users (and, at ``users_per_day``,
    days) still needed for the sequential test to find a lift of ``mde_`` with 80 % power. A treatment the
    sequence has decided (or ``stopped``) needs none: ``decided``."""
    out = {}
    for c in comparisons:
        se, n = c.get("lift_se"), users[control] + users[c["variant"]]
        decided = c.get("sequential") != "inconclusive" or c["variant"] in stopped
        more = users_still_needed(se, n, mde_, alpha=alpha, target=TARGET_POWER, sequential_tuning=tuning) \
            if se is not None and n > 0 and not decided else None
        days = more / users_per_day if more is not None and users_per_day else None
        out[c["variant"]] = {"decided": decided, "users_still_needed": None if more is None else math.ceil(more),
                             "days_still_needed": None if days is None else round(days, 1)}
    return {"mde": mde_, "target_power": TARGET_POWER, "sequential": True, "users_per_day": users_per_day,
            "variants": out}
