"""What gbstats computes: JSON cases on stdin, one JSON result per case on stdout.

A case: {"kind": "mean" | "ratio" | "cuped_mean" | "cuped_ratio", "alpha": …, "tuning": …, "a": sums,
"b": sums}, sums being the fields of the matching gbstats statistic (see ``_stat``); or {"kind": "power",
"se": …, "n": …, "mde": …, "alpha": …, "target": …, "sequential": bool, "tuning": …}: the users still needed
(MidExperimentPower, no prior)."""

import json
import sys

from gbstats.frequentist.tests import FrequentistConfig, SequentialConfig, SequentialTwoSidedTTest, TwoSidedTTest
from gbstats.models.results import EffectMomentsResult, TestResult, Uplift
from gbstats.models.tests import BaseConfig
from gbstats.power.midexperimentpower import MidExperimentPower, MidExperimentPowerConfig
from gbstats.models.statistics import (
    RatioStatistic,
    RegressionAdjustedRatioStatistic,
    RegressionAdjustedStatistic,
    SampleMeanStatistic,
)


def _moments(n, m):
    return SampleMeanStatistic(n=n, sum=m[0], sum_squares=m[1])


def _stat(kind, s):
    n = s["n"]
    if kind == "mean":
        return _moments(n, s["x"])
    if kind == "ratio":
        return RatioStatistic(n=n, m_statistic=_moments(n, s["m"]), d_statistic=_moments(n, s["d"]),
                              m_d_sum_of_products=s["m_d"])
    if kind == "cuped_mean":
        return RegressionAdjustedStatistic(n=n, post_statistic=_moments(n, s["post"]),
                                           pre_statistic=_moments(n, s["pre"]),
                                           post_pre_sum_of_products=s["post_pre"], theta=None)
    md, mmp, mdp, dmp, ddp, mpdp = s["products"]
    return RegressionAdjustedRatioStatistic(
        n=n, m_statistic_post=_moments(n, s["m"]), d_statistic_post=_moments(n, s["d"]),
        m_statistic_pre=_moments(n, s["m_pre"]), d_statistic_pre=_moments(n, s["d_pre"]),
        m_post_m_pre_sum_of_products=mmp, d_post_d_pre_sum_of_products=ddp, m_pre_d_pre_sum_of_products=mpdp,
        m_post_d_post_sum_of_products=md, m_post_d_pre_sum_of_products=mdp, m_pre_d_post_sum_of_products=dmp,
        theta=None)


def _still_needed(case):
    moments = EffectMomentsResult(point_estimate=0.0, standard_error=case["se"], pairwise_sample_size=case["n"],
                                  error_message=None, post_stratification_applied=False)
    result = TestResult(expected=0.0, ci=(0.0, 0.0), uplift=Uplift(dist="normal", mean=0.0, stddev=case["se"]),
                        errorMessage=None)
    config = MidExperimentPowerConfig(target_power=case["target"], target_mde=case["mde"],
                                      sequential=case["sequential"], sequential_tuning_parameter=case["tuning"])
    needed = MidExperimentPower(moments, result, BaseConfig(alpha=case["alpha"]), config).calculate_sample_size()
    return {"additional_users": needed.additional_users, "message": needed.update_message}


def main():
    out = []
    for case in json.load(sys.stdin):
        if case["kind"] == "power":
            out.append(_still_needed(case))
            continue
        pair = [(_stat(case["kind"], case["a"]), _stat(case["kind"], case["b"]))]
        fixed = TwoSidedTTest(pair, FrequentistConfig(alpha=case["alpha"])).compute_result()
        seq = SequentialTwoSidedTTest(pair, SequentialConfig(
            alpha=case["alpha"], sequential_tuning_parameter=case["tuning"])).compute_result()
        out.append({"lift": fixed.expected, "se": fixed.uplift.stddev, "ci": list(fixed.ci), "p": fixed.pValue,
                    "cs": list(seq.ci), "p_sequential": seq.pValue, "error": fixed.errorMessage})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
