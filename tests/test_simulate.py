"""`dinrec simulate`: simulated users over HTTP, counted exactly by the service's A/B path, and an
A/A experiment that (with the sequential test) finds nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dinrec.serving.simulate import ClickModel
from tests.conftest import REPO


def test_the_click_model_follows_interest_and_position():
    m = ClickModel(base=0.01, gain=0.6)
    assert m.probability(0.5, 0) == 0.31  # top slot: log2(2) = 1
    assert m.probability(0.5, 2) == 0.31 / 2  # third slot: log2(4) = 2
    assert m.probability(0.0, 0) < m.probability(0.1, 0) < m.probability(1.0, 0) <= 1.0


@pytest.mark.slow
def test_an_aa_simulation_counts_every_impression_and_click_and_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "simulate", "--experiment", "aa", "--users", "300",
                          "--rounds", "2", "--k", "8"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    served, variants = report["served"], report["results"]["variants"]
    assert set(served) == {"a", "b"} and sum(v["requests"] for v in served.values()) == 600
    for name in ("a", "b"):  # what the users saw and clicked is exactly what the counters hold
        assert variants[name]["impressions"] == served[name]["shown"]
        assert variants[name]["clicks"] == served[name]["clicked"] > 0
        assert variants[name]["users"] == served[name]["requests"] // 2
    assert report["unattributed"]["orphan_clicks"] == 0  # every click joined its logged impression
    (comparison,) = report["results"]["comparisons"]
    assert comparison["sequential"] == "inconclusive" and report["stopped"] == {}
    assert not report["results"]["srm"]["flagged"]


def _simulate(experiment: str, users: int = 300, rounds: int = 2) -> dict:
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "simulate", "--experiment", experiment,
                          "--users", str(users), "--rounds", str(rounds), "--guardrail-s", "0.5"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_din_beats_popularity_on_simulated_users_with_significance():
    report = _simulate("din-vs-popular")
    (popular,) = report["results"]["comparisons"]
    assert popular["variant"] == "popular" and popular["significant"] and popular["ci_high"] < 0
    variants = report["results"]["variants"]
    assert variants["din"]["ctr"] > 2 * variants["popular"]["ctr"]


@pytest.mark.slow
def test_the_origin_story_a_worse_model_is_stopped_by_the_guardrail_mid_run():
    # 600 users × 3 rounds: the champion serves the ranking blend, the shuffled model DIN's score alone
    # (lift about −40 %), which the always-valid interval separates from zero at this size, not at 300 × 2.
    report = _simulate("origin-story", users=600, rounds=3)
    models = report["models"]
    assert models["shuffled"]["test_auc"] < models["champion"]["test_auc"]  # the lower offline AUC shipped
    assert list(report["stopped"]) == ["shuffled"] and report["stopped"]["shuffled"]["cs_high"] < 0
    # Stopped while users were still arriving: later requests of its users left the experiment.
    assert report["served"]["(none)"]["requests"] > 0
    assert report["served"]["shuffled"]["requests"] < report["served"]["champion"]["requests"]


@pytest.mark.slow
def test_an_arm_that_lifts_ctr_but_loses_buys_is_stopped_on_conversions_mid_run():
    """The clickbait arm serves the same lists shown so they tempt clicks (×1.5) and lose buyers (×0.25 of
    what is clicked): CTR, the goal, rises; conversions per user, the default guardrail, fall — and the
    guardrail stops the arm on conversions while users are still arriving. Its figures are shown as they
    stood when it was stopped: its users go on buying under the default experience afterwards."""
    report = _simulate("clickbait", users=600, rounds=6)
    stop = report["stopped"]["clickbait"]
    assert (stop["metric"], stop["reason"]) == ("conversions_per_user", "guardrail") and stop["cs_high"] < 0
    assert report["served"]["(none)"]["requests"] > 0  # stopped mid-run: its users left the experiment
    metrics = report["results"]["metrics"]
    assert [metrics[m]["role"] for m in ("ctr", "conversions_per_user", "value_per_user")] == \
        ["goal", "guardrail", "secondary"]
    (ctr,), (buys,) = metrics["ctr"]["comparisons"], metrics["conversions_per_user"]["comparisons"]
    assert ctr["lift"] > 0.2 and buys["lift"] < -0.3  # clicks up, buys down, as the arm stood when stopped
    assert buys["as_of"] == metrics["conversions_per_user"]["variants"]["clickbait"]["as_of"] <= stop["at"]
    assert buys["cs_high"] < 0 and buys["cuped"]  # the users' earlier behaviour is the covariate
    served = report["served"]
    assert served["clickbait"]["clicked"] / served["clickbait"]["shown"] > served["control"]["clicked"] / \
        served["control"]["shown"]
