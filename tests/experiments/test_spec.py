"""Experiments: deterministic, sticky assignment (GrowthBook's v2 bucketing) and validated definitions."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dinrec.experiments.document import ExperimentsDocument
from dinrec.experiments.spec import Experiment, bucket, fnv1a32


def _exp(**kw) -> Experiment:
    base = {"name": "seq-len", "status": "running",
            "variants": [{"name": "l50", "overrides": {"seq_len": 50}}, {"name": "l20", "overrides": {"seq_len": 20}}]}
    return Experiment.model_validate({**base, **kw})


def _arm(exp: Experiment, user: str) -> str:
    """The name of the variant ``exp`` assigns ``user`` to, who must be in the experiment."""
    variant = exp.assign(user)
    assert variant is not None, user
    return variant.name


def test_fnv1a_matches_the_published_test_vectors():
    assert fnv1a32("") == 0x811C9DC5 and fnv1a32("a") == 0xE40C292C and fnv1a32("foobar") == 0xBF9CF968
    assert bucket("s", "u1") == (fnv1a32(str(fnv1a32("su1"))) % 10000) / 10000


def test_assignment_follows_the_weights_and_is_the_same_every_time():
    exp = _exp(variants=[{"name": "a", "weight": 3}, {"name": "b", "weight": 1}])
    users = [f"u{i}" for i in range(20_000)]
    first = [_arm(exp, u) for u in users]
    assert first == [_arm(_exp(variants=[{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]), u)
                     for u in users]  # a fresh object (another replica, a restart) agrees
    share_a = first.count("a") / len(first)
    assert 0.74 < share_a < 0.76


def test_raising_coverage_never_moves_an_assigned_user():
    users = [f"u{i}" for i in range(10_000)]
    low, high = _exp(coverage=0.2), _exp(coverage=0.8)
    at_low = {u: low.assign(u) for u in users}
    inside = [u for u, v in at_low.items() if v is not None]
    assert 0.18 < len(inside) / len(users) < 0.22
    assert all(_arm(high, u) == _arm(low, u) for u in inside)
    assert 0.78 < sum(high.assign(u) is not None for u in users) / len(users) < 0.82


def test_only_a_running_experiment_assigns_and_a_new_seed_reshuffles():
    users = [f"u{i}" for i in range(4000)]
    assert all(_exp(status=s).assign("u1") is None for s in ("draft", "stopped"))
    a, b = _exp(), _exp(seed="another")
    moved = sum(_arm(a, u) != _arm(b, u) for u in users) / len(users)
    assert 0.45 < moved < 0.55  # independent of the first split


@pytest.mark.parametrize("bad, match", [
    ({"variants": [{"name": "a"}]}, "at least 2"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, "distinct"),
    ({"control": "nope"}, "not one of the variants"),
    ({"coverage": 1.5}, "less than or equal to 1"),
    ({"ramp": [0.1, 0.05, 0.5]}, "ramp steps must increase"),
    ({"ramp": [0.1, 1.2]}, "less than or equal to 1"),
    ({"variants": [{"name": "a", "weight": 0}, {"name": "b"}]}, "greater than 0"),
    ({"variants": [{"name": "a", "overrides": {"seq_len": 20, "temperature": 2}}, {"name": "b"}]}, "Extra inputs"),
])
def test_bad_definitions_are_refused_with_the_reason(bad, match):
    with pytest.raises(ValidationError, match=match):
        _exp(**bad)


def test_the_experiments_file_loads_and_names_itself_when_invalid(tmp_path):
    good = tmp_path / "experiments.json"
    good.write_text(json.dumps({"experiments": [_exp().model_dump(mode="json"), _exp(name="x", status="draft")
                                                .model_dump(mode="json")]}))
    loaded, _ = ExperimentsDocument.open(good).read()  # the one way the experiments are read
    assert [e.name for e in loaded.running()] == ["seq-len"] and loaded.experiments[0].control_name == "l50"
    bad = tmp_path / "bad.json"
    bad.write_text('{"experiments": [{"name": "x"}]}')
    with pytest.raises(ValueError, match="bad.json: not a valid experiments file"):
        ExperimentsDocument.open(bad).read()
