"""CTR statistics: the delta-method variance matches what repeated experiments show (a binomial one
does not), SRM is flagged when assignment is skewed, and the sequential test stays honest when peeked at."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dinrec.benchmarks.ab_bench import bench_ab
from dinrec.experiments.stats import VariantSums, analyse, compare, srm_p_value


def _users(rng, n_users: int, ctr: float = 0.05, concentration: float = 10.0) -> list[tuple[float, float]]:
    n = 1 + rng.poisson(12, n_users)
    p = rng.beta(ctr * concentration, (1 - ctr) * concentration, n_users)
    return list(zip(n.astype(float), rng.binomial(n, p).astype(float), strict=True))


def test_sums_are_the_per_user_sums():
    s = VariantSums.of([(3, 1), (5, 0), (2, 2)])
    assert (s.users, s.impressions, s.clicks, s.impressions_sq, s.clicks_sq, s.cross) == (3, 10, 3, 38, 5, 7)
    assert s.ctr == pytest.approx(0.3)


def test_the_delta_method_variance_is_what_repeated_experiments_show():
    rng = np.random.default_rng(0)
    ctrs, estimates = [], []
    for _ in range(400):
        s = VariantSums.of(_users(rng, 2000))
        ctrs.append(s.ctr)
        estimates.append(s.ctr_variance())
    empirical = float(np.var(ctrs, ddof=1))
    assert float(np.mean(estimates)) == pytest.approx(empirical, rel=0.15)
    s = VariantSums.of(_users(rng, 2000))
    binomial = s.ctr * (1 - s.ctr) / s.impressions  # impressions treated as independent
    assert empirical > 1.5 * binomial  # that would understate it: the check has teeth


def test_srm_is_flagged_when_assignment_is_skewed():
    assert srm_p_value([10_400, 9_600], [0.5, 0.5]) < 0.001
    assert srm_p_value([10_050, 9_950], [0.5, 0.5]) > 0.05
    assert srm_p_value([7_530, 2_470], [0.75, 0.25]) > 0.05  # uneven on purpose is not a mismatch
    rng = np.random.default_rng(1)
    a, b = VariantSums.of(_users(rng, 10_400)), VariantSums.of(_users(rng, 9_600))
    assert analyse({"a": a, "b": b}, "a")["srm"]["flagged"]


def test_a_real_lift_is_found_and_the_sequence_is_wider_than_the_interval():
    rng = np.random.default_rng(2)
    control = VariantSums.of(_users(rng, 20_000, ctr=0.05))
    better = VariantSums.of(_users(rng, 20_000, ctr=0.06))
    r = compare(control, better, "b")
    assert r.lift == pytest.approx(better.ctr / control.ctr - 1)
    assert 0.1 < r.lift < 0.3 and r.significant and r.p_value < 1e-6 and r.sequential == "better"
    assert r.cs_low < r.ci_low < r.lift < r.ci_high < r.cs_high
    same = compare(control, control, "a2")
    assert same.lift == 0 and same.p_value == 1.0 and same.sequential == "inconclusive"
    worse = compare(control, VariantSums.of(_users(rng, 20_000, ctr=0.04)), "w")
    assert worse.sequential == "worse"
    empty = compare(VariantSums(0, 0, 0, 0, 0, 0), better, "x")
    assert math.isnan(empty.lift) and empty.sequential == "inconclusive"


def test_peeking_inflates_the_fixed_test_but_not_the_sequential_one():
    r = bench_ab(runs=300, users=3000, looks=10, lift=0.25, seed=3)
    assert r["runs"] == 300
    assert 0.015 <= r["aa_fpr_fixed"]["rate"] <= 0.095  # ≈ alpha, one look (300 runs: ±2.5 se)
    assert r["aa_fpr_fixed_peeking"]["rate"] > r["aa_fpr_fixed"]["rate"] + 0.04
    assert r["aa_fpr_sequential"]["rate"] <= 0.05
    assert r["power_fixed"]["rate"] > 0.8 and r["power_sequential"]["rate"] > 0.5


def test_a_lift_interval_is_cut_at_minus_100_percent():
    """gbstats' intervals are symmetric about the lift, so a nearly dead arm's reach below −100 %, which no
    ratio of CTRs can: the bound is cut there (the feasible part of the interval, the same coverage)."""
    control = VariantSums.of([(10, 3)] * 200 + [(10, 1)] * 200)
    nearly_dead = VariantSums.of([(10, 0)] * 395 + [(10, 1)] * 5)  # CTR 0.1 % against 20 %
    r = compare(control, nearly_dead, "t")
    assert r.lift < -0.9 and -1 < r.ci_low < r.lift < r.ci_high < 0 and r.cs_low == -1 < r.lift < r.cs_high < 0
    assert r.lift - r.lift_se * 3 < -1  # uncut, the sequence would reach below −100 %
    dead = VariantSums.of([(10, 0)] * 400)  # no click at all
    r = compare(control, dead, "t")
    assert r.lift == -1 and r.ci_low == -1 and r.cs_low == -1 and r.sequential == "worse"


def test_an_arm_with_no_users_yet_is_nothing_to_compare_not_an_error():
    """A timeline point can hold control's first users and none of a treatment's (or the reverse): the
    results page showed a 500 for the whole experiment when either arm's n was 0."""
    some = VariantSums.of([(10, 1)] * 50 + [(10, 0)] * 50)
    nobody = VariantSums(0, 0, 0, 0, 0, 0)
    for control, treatment in ((some, nobody), (nobody, some), (nobody, nobody)):
        r = compare(control, treatment, "t")
        assert math.isnan(r.lift) and r.sequential == "inconclusive" and not r.significant
    assert compare(some, some, "t").lift == 0  # the guard only takes the empty arm


def test_the_running_intersection_only_narrows_so_a_verdict_stands():
    from dinrec.experiments.stats import intersect, verdict

    looks = [(-0.5, 0.2), (-0.4, -0.01), (-0.3, 0.05), (-0.35, 0.1)]  # the third alone would say inconclusive
    running = None
    verdicts = []
    for low, high in looks:
        running = intersect(running, low, high)
        verdicts.append(verdict(*running))
    assert running == (-0.3, -0.01) and verdicts == ["inconclusive", "worse", "worse", "worse"]
    assert intersect(running, float("nan"), float("nan")) == running  # a look with nothing to compare
    nothing_yet = intersect(None, float("nan"), float("nan"))  # the first looks, before any click
    assert intersect(nothing_yet, -0.4, -0.01) == (-0.4, -0.01)


def test_holm_adjusts_step_down_and_leaves_nothing_to_compare_alone():
    from dinrec.experiments.stats import holm

    # Holm (1979): sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1, never below the one before.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([0.2, float("nan"), 0.9])
    assert adjusted[0] == pytest.approx(0.4) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.9)


def test_with_several_treatments_each_verdict_is_held_to_holm_s_level():
    """An arm the sequence alone would call worse is inconclusive once the other treatments are counted:
    three looks at once cost the family its 5 %, not each arm."""
    from dinrec.experiments.stats import corrected

    rng = np.random.default_rng(5)
    control = VariantSums.of(_users(rng, 4000, ctr=0.05))
    arms = {name: VariantSums.of(_users(rng, 4000, ctr=ctr)) for name, ctr in (("a", 0.05), ("b", 0.05))}
    worse = None
    for ctr in np.linspace(0.049, 0.040, 40):  # find a worse arm whose always-valid p sits between 0.05/3 and 0.05
        candidate = VariantSums.of(_users(np.random.default_rng(int(ctr * 1e5)), 4000, ctr=ctr))
        r = compare(control, candidate, "w")
        if r.sequential == "worse" and 0.05 / 3 < r.p_sequential < 0.05:
            worse = candidate
            break
    assert worse is not None
    alone = corrected([compare(control, worse, "w")], 0.05)[0]
    together = corrected([compare(control, worse, "w")] + [compare(control, s, n) for n, s in arms.items()], 0.05)
    assert alone.sequential == "worse" and together[0].sequential == "inconclusive"
    assert together[0].p_sequential > alone.p_sequential
    result = analyse({"c": control, "w": worse, **arms}, "c")
    assert result["correction"] == "holm" and result["comparisons"][0]["sequential"] == "inconclusive"
    assert result["srm"]["expected_share"] == {"c": 0.25, "w": 0.25, "a": 0.25, "b": 0.25}
    assert sum(result["srm"]["observed_share"].values()) == pytest.approx(1.0)
    assert analyse({"c": control, "w": worse}, "c")["correction"] is None
