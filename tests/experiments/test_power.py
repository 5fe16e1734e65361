"""The power calculator predicts what simulated experiments find, and its MDE is its power's inverse."""

from __future__ import annotations

import numpy as np
import pytest

from dinrec.benchmarks.ab_bench import World, _users, bench_ab
from dinrec.experiments.power import mde, plan, power, users_still_needed
from dinrec.experiments.stats import Moments, RatioStat


def _ctr_world(world: World) -> tuple[float, float]:
    """The simulated world's CTR and its per-user variance (the delta method's, over a million users)."""
    u = _users(np.random.default_rng(1), world, 1_000_000, 0.0)
    s = RatioStat(Moments(len(u["c"]), u["c"].sum(), (u["c"] ** 2).sum()),
                  Moments(len(u["n"]), u["n"].sum(), (u["n"] ** 2).sum()), float((u["c"] * u["n"]).sum()))
    return s.mean, s.variance


def test_the_planned_power_is_what_simulated_experiments_find():
    mean, variance = _ctr_world(World())
    simulated = bench_ab(runs=400, users=3000, looks=2, lift=0.1, seed=11)
    predicted = power(mean, variance, 0.1, 6000)
    assert 0.3 < predicted < 0.95  # a case where power is neither trivial nor certain
    assert predicted == pytest.approx(simulated["power_fixed"]["rate"], abs=3 * simulated["power_fixed"]["se"] + 0.01)


def test_the_mde_is_the_effect_found_with_the_target_power():
    for sequential in (None, 5000):
        found = mde(0.05, 0.02, 20_000, target=0.8, sequential_tuning=sequential)
        assert found is not None and power(0.05, 0.02, found, 20_000, sequential_tuning=sequential) == \
            pytest.approx(0.8, abs=1e-6)
    # Always-valid intervals are wider: more users for the same effect.
    always_valid, fixed_horizon = mde(0.05, 0.02, 20_000, sequential_tuning=5000), mde(0.05, 0.02, 20_000)
    assert always_valid is not None and fixed_horizon is not None and always_valid > fixed_horizon
    assert mde(0.05, 0.02, 10) is None  # no effect is detectable with ten users


def test_a_plan_names_the_first_day_the_effect_is_found():
    mean, variance = 0.05, 0.0066  # CTR 5 %, the simulated world's per-user variance
    p = plan(mean, variance, 0.05, users_per_day=2000, days=30)
    day = p["days_needed"]
    assert day is not None and round(p["days"][day - 1]["power"], 2) >= 0.8 > round(p["days"][day - 2]["power"], 2)
    assert [d["power"] for d in p["days"]] == sorted(d["power"] for d in p["days"])  # more users, more power
    assert plan(mean, variance, 0.001, users_per_day=100, days=7)["days_needed"] is None


def test_users_still_needed_grow_as_the_effect_shrinks():
    small, large = (users_still_needed(0.05, 4000, m) for m in (0.02, 0.1))
    assert small is not None and large is not None and small > large > 0
    assert users_still_needed(0.001, 4000, 0.1) == 0  # already powered
